"""`fracgpu serve --check-settings`: the settings as `serve` reads them, judged without serving.

The chart's pre-install hook runs it in the webhook image with the webhook's environment
(tests/chart/test_settings_check.py), so that values the webhook would refuse fail the install
instead of leaving webhook pods that never start. Each case runs the real command.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

import pytest

from tests.webhook.clirun import ROOT, run_fracgpu
from webhook import settings
from webhook.cli.main import _parser

CLUSTER_FILE = ROOT / "examples" / "cluster.yaml"
# Never created: the check must not read the TLS files (the hook runs before the certificate
# Secret exists) nor need them to exist.
ABSENT = "/nonexistent/fracgpu"
SERVING = {
    "FRACGPU_TLS_CERT_FILE": f"{ABSENT}/tls.crt",
    "FRACGPU_TLS_KEY_FILE": f"{ABSENT}/tls.key",
    "FRACGPU_CLUSTER_FILE": str(CLUSTER_FILE),
}


def check(environ: Mapping[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    """The command with only ``environ`` as FRACGPU_* variables (none inherited)."""
    return run_fracgpu(["serve", "--check-settings", *flags], environ)


def refusal(environ: Mapping[str, str], *flags: str) -> str:
    """The settings loader's own message for ``environ`` and ``flags``, as `serve` has it."""
    args = _parser().parse_args(["serve", *flags])
    with pytest.raises(settings.SettingsError) as refused:
        settings.load(args, environ)
    return str(refused.value)


def test_valid_settings_are_one_line_and_exit_0() -> None:
    result = check(SERVING)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.count("\n") == 1
    assert "settings are valid" in result.stdout


# What the chart's values once let through to a webhook that then refused to start.
REFUSED = {
    "settle time past the reservation TTL": {"FRACGPU_SETTLE_SECONDS": "400"},
    "takeover grace under the settle time": {"FRACGPU_TAKEOVER_GRACE_SECONDS": "1"},
    "write-behind past the admission window": {"FRACGPU_WRITE_BEHIND_SECONDS": "60"},
    "controller interval at the TTL": {"FRACGPU_CONTROLLER_INTERVAL_SECONDS": "300"},
    "two resources of one name": {"FRACGPU_RESOURCE_HAMI_GPU": "tencent.com/vcuda-core"},
    "a value that does not parse": {"FRACGPU_PORT": "https"},
}


@pytest.mark.parametrize("bad", list(REFUSED.values()), ids=list(REFUSED))
def test_refused_settings_say_why_in_one_line_and_exit_2(bad: dict[str, str]) -> None:
    environ = {**SERVING, **bad}
    result = check(environ)
    assert result.returncode == 2, result.stdout
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.endswith(refusal(environ)), line
    assert "would not start" in line


def test_flags_are_read_as_serve_reads_them() -> None:
    """A flag wins over its variable, as in `serve`."""
    result = check({**SERVING, "FRACGPU_SETTLE_SECONDS": "400"}, "--settle-seconds", "5")
    assert result.returncode == 0, result.stderr
    result = check(SERVING, "--settle-seconds", "400")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.endswith(refusal(SERVING, "--settle-seconds", "400")), line


def test_what_serve_refuses_before_reading_a_file_is_refused_too() -> None:
    """Serving needs the TLS pair named and a source of state; the check says so."""
    no_tls = {"FRACGPU_CLUSTER_FILE": str(CLUSTER_FILE)}
    result = check(no_tls)
    assert result.returncode == 2
    assert "serving needs --tls-cert-file and --tls-key-file" in result.stderr
    no_state = {k: v for k, v in SERVING.items() if k != "FRACGPU_CLUSTER_FILE"}
    result = check(no_state)
    assert result.returncode == 2
    assert "no cluster state" in result.stderr


def test_the_check_contacts_no_cluster() -> None:
    """In cluster mode outside a pod (no service account, no API server) it still answers:
    it judges the settings, and leaves the connection to `serve`."""
    environ = {k: v for k, v in SERVING.items() if k != "FRACGPU_CLUSTER_FILE"}
    result = check({**environ, "FRACGPU_IN_CLUSTER": "true"})
    assert result.returncode == 0, result.stderr
