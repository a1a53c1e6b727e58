"""One settings object from flags and environment; every option documented."""

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from fracgpu.model import MemoryRequest
from fracgpu.placement import Policy
from fracgpu.placement.fragmentation import HELD_WHOLE_NODES
from webhook import settings
from webhook.cli import main as cli
from webhook.cluster.apiclient import Endpoint
from webhook.cluster.kubestate import KubeStateSettings
from webhook.cluster.leader import LeaseSettings
from webhook.cluster.runtime import ClusterMode

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def parse(argv: list[str], env: dict[str, str]) -> settings.Settings:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    return settings.load(parser.parse_args(argv), env)


def test_defaults() -> None:
    config = parse([], {})
    assert config.port == 8443
    assert config.policy is Policy.FRAGMENTATION
    assert config.dialects.default_memory == MemoryRequest(percent=100)
    assert config.dialects.default_cores == 0
    assert config.max_body_bytes == 8 * 1024 * 1024
    assert "system:serviceaccount:fracgpu-system:fracgpu-webhook" in config.service_accounts


def test_flags_beat_environment_beats_defaults() -> None:
    env = {"FRACGPU_PORT": "9443", "FRACGPU_POLICY": "spread", "FRACGPU_SPLIT_COUNT": "4"}
    config = parse(["--port", "10443"], env)
    assert (config.port, config.policy, config.split_count) == (10443, Policy.SPREAD, 4)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("50%", MemoryRequest(percent=50)),
        ("4096", MemoryRequest(mib=4096)),
        ("1Gi", MemoryRequest(mib=1024)),
        ("1000", MemoryRequest(mib=1024)),
    ],
)
def test_default_gpu_memory_forms(value: str, expected: MemoryRequest) -> None:
    assert parse(["--default-gpu-memory", value], {}).dialects.default_memory == expected


def test_service_accounts_and_resource_names() -> None:
    config = parse(
        ["--resource-hami-gpu", "example.com/vgpu"],
        {"FRACGPU_SERVICE_ACCOUNTS": "system:serviceaccount:a:b, system:serviceaccount:c:d"},
    )
    assert config.service_accounts == {"system:serviceaccount:a:b", "system:serviceaccount:c:d"}
    assert config.dialects.names.hami_gpu == "example.com/vgpu"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "70000"], {}, "--port='70000' is not allowed: use 0-65535"),
        (
            [],
            {"FRACGPU_POLICY": "random"},
            "FRACGPU_POLICY='random' is not allowed: use one of binpack, spread",
        ),
        ([], {"FRACGPU_DEFAULT_GPU_CORES": "120"}, "use 0-100"),
        ([], {"FRACGPU_DEFAULT_GPU_MEMORY": "150%"}, "use a whole 1%-100% of the card"),
        ([], {"FRACGPU_DEFAULT_GPU_MEMORY": "x%"}, "use a whole 1%-100% of the card"),
        (
            [],
            {"FRACGPU_DEFAULT_GPU_MEMORY": "4GB"},
            "'4GB' is none of these: use a share of the card (50%), MiB as a plain whole number "
            "(4096) or a Kubernetes quantity of bytes (4Gi: Gi = 2^30 bytes; 4G = 4 x 10^9 "
            "bytes, about 3815 MiB)",
        ),
        ([], {"FRACGPU_GPUSHARE_MEMORY_UNIT": "KiB"}, "use GiB or MiB"),
        ([], {"FRACGPU_SPLIT_COUNT": "0"}, "use a whole number of 1 or more"),
        ([], {"FRACGPU_MAX_BODY_BYTES": "many"}, "FRACGPU_MAX_BODY_BYTES='many' is not allowed"),
        (["--resource-vcuda-core", "gpu"], {}, "use a qualified extended resource name"),
        (
            ["--resource-vcuda-core", "nvidia.com/gpu"],
            {},
            "--resource-vcuda-core and --resource-hami-gpu (its default) are both "
            "'nvidia.com/gpu': each --resource-* setting must name a different resource",
        ),
        (["--tls-cert-file", "/x.crt"], {}, "--tls-cert-file and --tls-key-file go together"),
        ([], {"FRACGPU_LOG_LEVEL": "chatty"}, "use DEBUG, INFO, WARNING or ERROR"),
    ],
)
def test_bad_values_name_their_source_and_what_is_allowed(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(settings.SettingsError) as raised:
        parse(argv, env)
    assert message in str(raised.value)


def test_from_mapping_rejects_unknown_keys() -> None:
    with pytest.raises(settings.SettingsError, match="unknown setting"):
        settings.from_mapping({"colour": "blue"})


def test_every_option_is_documented() -> None:
    text = DOCS.read_text()
    for option in settings.OPTIONS:
        assert f"`{option.flag}`" in text, option.flag
        assert f"`{option.env}`" in text, option.env


def test_help_docs_and_errors_offer_every_placement_policy(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # fgd was accepted but left out of --help and the chart: every place lists the enum.
    monkeypatch.setenv("COLUMNS", "2000")  # no wrapping inside "best-fit"
    offered = ", ".join(policy.value for policy in Policy)
    for command in ("admit", "serve"):
        assert f"one of {offered} " in " ".join(help_of(command, capsys).split()), command
    with pytest.raises(settings.SettingsError, match=f"use one of {offered}$"):
        parse([], {"FRACGPU_POLICY": "random"})
    row = next(line for line in DOCS.read_text().splitlines() if line.startswith("| `--policy`"))
    assert f"one of {', '.join(f'`{policy.value}`' for policy in Policy)}:" in row


def test_a_malformed_number_is_named_in_words_not_python() -> None:
    for argv, env, message in (
        (["--port", "abc"], {}, "--port='abc' is not allowed: not a whole number"),
        ([], {"FRACGPU_SETTLE_SECONDS": "soon"}, "FRACGPU_SETTLE_SECONDS='soon' is not allowed"),
    ):
        with pytest.raises(settings.SettingsError) as raised:
            parse(argv, env)
        assert message in str(raised.value)
        assert "invalid literal" not in str(raised.value)
        assert "could not convert" not in str(raised.value)


def test_the_startup_log_shows_settings_as_an_operator_writes_them() -> None:
    lines = settings.describe(parse(["--cluster-file", "examples/cluster.yaml"], {}))
    text = "\n".join(lines)
    assert "cluster_file=examples/cluster.yaml" in lines
    assert "policy=fragmentation" in lines
    assert "tls_cert_file=(unset)" in lines
    for python in ("PosixPath(", "<Policy.", "DialectConfig(", "frozenset(", "None"):
        assert python not in text


def test_every_default_has_one_home() -> None:
    """``Settings()`` and settings read from nothing agree: each default is declared once
    (in OPTIONS, or in the class a group of options is declared from)."""
    assert settings.Settings() == settings.from_mapping({})


@pytest.mark.parametrize(
    ("cls", "operator_fields"),
    [
        (
            KubeStateSettings,
            {
                "split_count",
                "memory_scaling",
                "reservation_ttl_s",
                "settle_s",
                "write_behind_s",
                "admission_window_s",
                "self_check_s",
            },
        ),
        (LeaseSettings, {"takeover_grace_s", "handover_wait_s"}),
        (ClusterMode, {"controller_interval_s"}),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_sub_settings_take_operator_settings_without_defaults_of_their_own(
    cls: type, operator_fields: set[str]
) -> None:
    # A second default here is how the reservation TTL came to be 60 in one place and 300
    # in another: these fields are only ever filled from the webhook's settings.
    with_default = {
        f.name
        for f in dataclasses.fields(cls)
        if f.name in operator_fields
        and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)
    }
    assert with_default == set()


def test_cluster_mode_is_built_from_the_settings() -> None:
    config = settings.from_mapping(
        {
            "reservation_ttl_seconds": "120",
            "settle_seconds": "7",
            "takeover_grace_seconds": "9",
            "held_whole_nodes": "5",
            "held_wait_seconds": "60",
        }
    )
    mode = ClusterMode.from_settings(config, Endpoint("https://127.0.0.1:1"))
    assert mode.state.reservation_ttl_s == 120
    assert (mode.state.held_whole_nodes, mode.held_wait_s) == (5, 60)
    assert (mode.lease.handover_wait_s, mode.lease.takeover_grace_s) == (7, 9)
    assert mode.controller_interval_s == config.controller_interval_seconds


@pytest.mark.parametrize("relation", settings.RELATIONS, ids=lambda r: f"{r.lower}<{r.upper}")
def test_each_relation_is_checked_at_start_with_both_settings_named(
    relation: settings.Relation,
) -> None:
    upper = int(settings.Settings().__dict__[relation.upper])
    # at the bound: allowed only where the relation allows equality
    equal = {relation.lower: str(upper), relation.upper: str(upper)}
    if relation.or_equal:
        settings.from_mapping(equal)
    else:
        with pytest.raises(settings.SettingsError):
            settings.from_mapping(equal)
    above = {relation.lower: str(upper * 2), relation.upper: str(upper)}
    with pytest.raises(settings.SettingsError) as raised:
        settings.from_mapping(above)
    message = str(raised.value)
    # from_mapping gives values as FRACGPU_* variables: the message names those
    lower_env, upper_env = (
        settings.ENV_PREFIX + relation.lower.upper(),
        settings.ENV_PREFIX + relation.upper.upper(),
    )
    assert f"{lower_env} ({upper * 2}) must be" in message
    assert f"{upper_env} ({upper})" in message
    assert relation.why in message


def test_the_documented_relations_are_the_checked_ones() -> None:
    text = DOCS.read_text()
    section = text[text.index("## Relations checked at start-up") :]
    section = section[: section.index("\n## ", 1)]
    documented = set(re.findall(r"^\| `(--[\w-]+)` \| [\w ]+ \| `(--[\w-]+)` \|", section, re.M))
    checked = {
        (settings.option_flag(r.lower), settings.option_flag(r.upper)) for r in settings.RELATIONS
    }
    assert documented == checked


def test_the_docs_list_each_option_under_its_scope_with_its_default() -> None:
    text = DOCS.read_text()
    headings = {
        settings.Scope.ADMISSION: "### Admission",
        settings.Scope.SERVING: "### Serving",
        settings.Scope.CLUSTER: "### Cluster mode",
    }
    for option in settings.OPTIONS:
        section = text[text.index(headings[option.scope]) :]
        section = section[: section.index("\n#", 1)]
        row = next(
            (line for line in section.splitlines() if line.startswith(f"| `{option.flag}` |")),
            None,
        )
        assert row is not None, f"{option.flag} is not under {headings[option.scope]}"
        default = row.split(" | ")[2]
        assert default == (f"`{option.default}`" if option.default else "(none)"), option.flag


def help_of(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return capsys.readouterr().out


def test_admit_shows_only_the_settings_admission_reads(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of("admit", capsys)
    for option in settings.OPTIONS:
        shown = f"{option.flag} " in text
        assert shown == (option.scope is settings.Scope.ADMISSION), option.flag
    for flag in ("--tls-cert-file", "--lease-name", "--identity", "--port", "--advertise-url"):
        assert flag not in text


def test_serve_shows_every_setting_by_scope(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of("serve", capsys)
    for option in settings.OPTIONS:
        assert f"{option.flag} " in text, option.flag
    for title in settings.SCOPE_TITLES.values():
        assert title in text


def test_admit_reads_no_variable_of_a_setting_it_does_not_use() -> None:
    # A serving variable left in the environment must not stop `fracgpu admit`.
    config = settings.load(None, {"FRACGPU_PORT": "not-a-port"}, settings.ADMIT_SCOPES)
    assert config.port == settings.Settings().port
    with pytest.raises(settings.SettingsError, match="FRACGPU_PORT='not-a-port'"):
        settings.load(None, {"FRACGPU_PORT": "not-a-port"}, settings.SERVE_SCOPES)


def test_lease_timings_must_nest() -> None:
    # A leader must renew before it stops placing, and stop before another may take over.
    with pytest.raises(ValueError, match=r"renew_deadline_s \(20\) < lease_duration_s \(15\)"):
        LeaseSettings(
            "ns", "lease", "me", renew_deadline_s=20, takeover_grace_s=30, handover_wait_s=5
        )
    LeaseSettings("ns", "lease", "me", takeover_grace_s=30, handover_wait_s=5)


def test_a_misspelt_setting_variable_is_named_with_the_one_meant() -> None:
    """A typo in the chart's webhook.extraEnv was ignored without a word and the setting
    kept its default; ``fracgpu serve`` logs each such variable."""
    environ = {
        "FRACGPU_POLCY": "spread",  # misspelt
        "FRACGPU_POLICY": "binpack",
        "FRACGPU_AGENT_METRICS_PORT": "9400",  # the agent's
        "FRACGPU_CERTS_SECRET": "x",  # the certs manager's
        "PATH": "/usr/bin",
        # What kubelet sets for the chart's Service fracgpu-webhook (enableServiceLinks).
        "FRACGPU_WEBHOOK_SERVICE_HOST": "10.0.0.9",
        "FRACGPU_WEBHOOK_SERVICE_PORT": "443",
        "FRACGPU_WEBHOOK_SERVICE_PORT_HTTPS": "443",
        "FRACGPU_WEBHOOK_PORT": "tcp://10.0.0.9:443",
        "FRACGPU_WEBHOOK_PORT_443_TCP": "tcp://10.0.0.9:443",
        "FRACGPU_WEBHOOK_PORT_443_TCP_PROTO": "tcp",
        "FRACGPU_WEBHOOK_PORT_443_TCP_PORT": "443",
        "FRACGPU_WEBHOOK_PORT_443_TCP_ADDR": "10.0.0.9",
        "FRACGPU_EXTENDR_PORT": "8889",  # misspelt, and no Service's
    }
    assert settings.unknown_variables(environ) == [
        "FRACGPU_EXTENDR_PORT is not a setting (did you mean FRACGPU_EXTENDER_PORT?): it is "
        "ignored",
        "FRACGPU_POLCY is not a setting (did you mean FRACGPU_POLICY?): it is ignored",
    ]


def test_held_whole_nodes_is_bounded_and_0_turns_it_off() -> None:
    assert parse([], {}).held_whole_nodes == HELD_WHOLE_NODES == 3
    assert parse(["--held-whole-nodes", "0"], {}).held_whole_nodes == 0
    for bad in ("-1", "65"):
        with pytest.raises(settings.SettingsError, match="from 0 \\(hold none\\) to 64"):
            parse([], {"FRACGPU_HELD_WHOLE_NODES": bad})


async def test_held_whole_nodes_reaches_the_embedded_view() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"
    for value in ("0", "7"):
        config = settings.from_mapping({"held_whole_nodes": value, "cluster_file": str(example)})
        view = await cli._state(config).view()
        assert view.held_whole_nodes == int(value)
