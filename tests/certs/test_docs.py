"""docs/certificates.md agrees with the code: every flag documented with its default, and the
cert-manager example issues the same names fracgpu-certs would."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from certs.commandline import build_parser
from certs.durations import format_duration
from certs.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "certificates.md"


def _flag_rows() -> dict[str, str]:
    """flag → default column of the settings table."""
    rows = re.findall(r"^\| `(--[a-z-]+)` \| ([^|]*) \|", DOC.read_text(), flags=re.MULTILINE)
    return {flag: default.strip().strip("`") for flag, default in rows}


def _parser_flags() -> set[str]:
    flags: set[str] = set()
    for action in build_parser()._actions:  # the subcommands share one set of flags
        choices: dict[str, Any] = getattr(action, "choices", None) or {}
        for sub in choices.values():
            flags.update(
                option
                for sub_action in sub._actions
                for option in sub_action.option_strings
                if option.startswith("--") and option not in ("--help", "--dir", "--projected")
            )
    return flags


def test_every_flag_is_documented_and_every_documented_flag_exists() -> None:
    assert set(_flag_rows()) == _parser_flags()


def test_documented_defaults_are_the_real_ones() -> None:
    rows = _flag_rows()
    defaults = Settings()
    for flag in (
        "namespace",
        "service",
        "secret",
        "ca-secret",
        "mutating-webhook",
        "validating-webhook",
        "cluster-domain",
    ):
        assert rows[f"--{flag}"] == getattr(defaults, flag.replace("-", "_")), flag
    for flag in ("serving-validity", "ca-validity", "ca-overlap", "interval", "retry-interval"):
        assert rows[f"--{flag}"] == format_duration(getattr(defaults, flag.replace("-", "_")))
    assert rows["--serving-renew-before"] == str(defaults.serving_renew_before)
    assert rows["--ca-renew-before"] == str(defaults.ca_renew_before)


def test_cert_manager_example_matches_what_fracgpu_certs_issues() -> None:
    block = re.search(r"```yaml\n(# 1\. .*?)```", DOC.read_text(), flags=re.DOTALL)
    assert block is not None
    objects = list(yaml.safe_load_all(block.group(1)))
    defaults = Settings()
    certificates = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Certificate"}
    serving = next(c for c in certificates.values() if not c["spec"].get("isCA"))
    assert serving["spec"]["secretName"] == defaults.secret
    assert tuple(serving["spec"]["dnsNames"]) == defaults.dns_names
    assert "server auth" in serving["spec"]["usages"]
    ca = next(c for c in certificates.values() if c["spec"].get("isCA"))
    assert ca["spec"]["secretName"] == defaults.ca_secret
    reference = f"{defaults.namespace}/{serving['metadata']['name']}"
    configurations = {
        o["metadata"]["name"]: o for o in objects if o["kind"].endswith("WebhookConfiguration")
    }
    assert set(configurations) == {defaults.mutating_webhook, defaults.validating_webhook}
    for configuration in configurations.values():
        annotations = configuration["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == reference
