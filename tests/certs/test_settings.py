"""Settings: durations, renewal windows, command line and environment, refusals."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from certs.commandline import parse_command_line
from certs.durations import Window, parse_duration
from certs.errors import SettingsError
from certs.settings import Settings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1h", timedelta(hours=1)),
        ("1h30m", timedelta(minutes=90)),
        ("365d", timedelta(days=365)),
        ("10y", timedelta(days=3650)),
        ("2w", timedelta(days=14)),
        (" 45s ", timedelta(seconds=45)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["", "1", "h", "1x", "1h 30m", "-1h", "1.5h"])
def test_bad_durations_say_what_is_allowed(bad: str) -> None:
    with pytest.raises(SettingsError, match="is not a duration: allowed: numbers with units"):
        parse_duration(bad, "interval")


def test_windows_are_a_share_of_the_lifetime_or_a_span() -> None:
    assert Window.parse("30%").before_expiry(timedelta(days=100)) == timedelta(days=30)
    assert Window.parse("30d").before_expiry(timedelta(days=1000)) == timedelta(days=30)
    assert str(Window.parse("30%")) == "30%"
    assert str(Window.parse("36h")) == "1d12h"
    with pytest.raises(SettingsError, match=r"use 1%\.\.99% of the lifetime"):
        Window.parse("100%")
    with pytest.raises(SettingsError, match="not a percentage"):
        Window.parse("abc%")


def test_command_line_builds_the_settings(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("{}\n")
    command = parse_command_line(
        [
            "run",
            "--namespace=gpu",
            "--service=hook",
            "--mutating-webhook=",
            "--cluster-domain=corp.example",
            "--extra-ip-addresses=127.0.0.1, ::1",
            "--serving-validity=90d",
            "--serving-renew-before=30d",
            "--interval=10m",
            f"--kubeconfig={kubeconfig}",
        ],
        env={},
    )
    s = command.settings
    assert command.name == "run"
    assert s.dns_names == ("hook", "hook.gpu", "hook.gpu.svc", "hook.gpu.svc.corp.example")
    assert s.webhook_configurations == (("ValidatingWebhookConfiguration", "fracgpu-validating"),)
    assert s.extra_ip_addresses == ("127.0.0.1", "::1")
    assert s.serving_validity == timedelta(days=90)
    assert s.serving_renew_before == Window(span=timedelta(days=30))
    assert s.interval == timedelta(minutes=10)
    assert s.kubeconfig == kubeconfig and not s.in_cluster


def test_environment_fills_in_and_flags_win() -> None:
    env = {
        "FRACGPU_CERTS_NAMESPACE": "from-env",
        "FRACGPU_CERTS_SERVICE": "env-hook",
        "FRACGPU_CERTS_CERT_MANAGER": "true",
    }
    s = parse_command_line(["ensure", "--service=flag-hook"], env=env).settings
    assert (s.namespace, s.service, s.cert_manager) == ("from-env", "flag-hook", True)
    with pytest.raises(SettingsError, match="is not a boolean"):
        parse_command_line(["ensure"], env={"FRACGPU_CERTS_CERT_MANAGER": "maybe"})


def test_inside_a_pod_the_service_account_is_used_unless_a_kubeconfig_is_given(
    tmp_path: Path,
) -> None:
    kubeconfig = tmp_path / "k"
    kubeconfig.write_text("{}\n")
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert parse_command_line(["ensure"], env=pod).settings.in_cluster
    assert not parse_command_line(
        ["ensure", f"--kubeconfig={kubeconfig}"], env=pod
    ).settings.in_cluster
    assert not parse_command_line(["ensure"], env={}).settings.in_cluster


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"namespace": "Bad_NS"}, "namespace: 'Bad_NS' is not a valid DNS name"),
        ({"ca_secret": "fracgpu-webhook-tls"}, "the CA key must live in its own Secret"),
        ({"extra_ip_addresses": ("999.1.1.1",)}, "is not an IPv4 or IPv6 address"),
        ({"serving_validity": timedelta(0)}, "serving-validity=0:00:00 is not allowed"),
        ({"serving_validity": timedelta(days=4000)}, "is longer than ca-validity"),
        ({"ca_overlap": timedelta(seconds=-1)}, "must not be negative"),
        (
            {"serving_renew_before": Window(span=timedelta(days=400))},
            "is not shorter than serving-validity",
        ),
        (
            {"ca_renew_before": Window(span=timedelta(days=100))},
            "serving-renew-before .* must be shorter than ca-renew-before",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings(**overrides)  # type: ignore[arg-type]
