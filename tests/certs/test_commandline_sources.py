"""fracgpu-certs names the flag or variable behind a refused value, takes each on/off flag
alone or with true/false, and says what to do when it finds no kubeconfig."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from certs.cli import main
from certs.commandline import parse_command_line
from certs.errors import SettingsError
from tests.certs.test_cli import _unreachable_kubeconfig

HINT = (
    "pass --kubeconfig, set KUBECONFIG or create ~/.kube/config, or inside a Pod pass --in-cluster"
)


@pytest.mark.parametrize(
    ("flag", "field", "variable"),
    [
        ("--in-cluster", "in_cluster", "FRACGPU_CERTS_IN_CLUSTER"),
        ("--cert-manager", "cert_manager", "FRACGPU_CERTS_CERT_MANAGER"),
    ],
)
def test_on_off_flags_take_the_bare_form_and_a_value(flag: str, field: str, variable: str) -> None:
    def value(argv: list[str], env: dict[str, str] | None = None) -> bool:
        settings = parse_command_line(["ensure", *argv], env=env or {}).settings
        return bool(getattr(settings, field))

    assert value([]) is False
    assert value([flag]) is True
    assert value([flag, "--namespace=x"]) is True
    assert value([flag, "true"]) is True
    assert value([f"{flag}=yes"]) is True
    assert value([flag, "false"]) is False
    assert value([], {variable: "1"}) is True
    assert value([flag, "false"], {variable: "true"}) is False  # the flag wins
    with pytest.raises(SettingsError) as raised:
        value([flag, "maybe"])
    assert str(raised.value) == (
        f"{flag}='maybe' is not a boolean: allowed are true/false, 1/0, yes/no (a flag alone "
        "means true)"
    )
    with pytest.raises(SettingsError, match=f"^{variable}='maybe' is not a boolean"):
        value([], {variable: "maybe"})


def test_files_projected_takes_the_bare_form_and_a_value(tmp_path: Path) -> None:
    def projected(*argv: str) -> bool:
        return parse_command_line(["files", f"--dir={tmp_path}", *argv], env={}).projected

    assert not projected()
    assert projected("--projected")
    assert projected("--projected", "true")
    assert not projected("--projected=false")
    with pytest.raises(SettingsError, match="--projected='x' is not a boolean"):
        projected("--projected=x")


def test_an_explicit_in_cluster_false_is_kept_inside_a_pod() -> None:
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert not parse_command_line(["ensure", "--in-cluster=false"], env=pod).settings.in_cluster


def test_an_empty_in_cluster_variable_is_no_setting_inside_a_pod() -> None:
    """A manifest's `value: ""` meant "not set" before on/off values were checked: inside a
    Pod, the service account is still the one choice."""
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "FRACGPU_CERTS_IN_CLUSTER": ""}
    assert parse_command_line(["ensure"], env=pod).settings.in_cluster


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {"FRACGPU_CERTS_INTERVAL": "soon"}, "FRACGPU_CERTS_INTERVAL='soon' is not a duration"),
        (["--interval=soon"], {"FRACGPU_CERTS_INTERVAL": "1h"}, "--interval='soon' is not a"),
        (
            [],
            {"FRACGPU_CERTS_SERVING_RENEW_BEFORE": "abc%"},
            "FRACGPU_CERTS_SERVING_RENEW_BEFORE='abc%' is not a percentage",
        ),
        (
            [],
            {"FRACGPU_CERTS_KUBECONFIG": "/nonexistent/kc"},
            "FRACGPU_CERTS_KUBECONFIG='/nonexistent/kc' is not allowed: the file does not exist; "
            "give the path of a kubeconfig file, or --in-cluster inside a Pod",
        ),
        (["--kubeconfig=/"], {}, "--kubeconfig='/' is not allowed: it is not a file"),
    ],
)
def test_a_refused_value_names_its_flag_or_variable(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        parse_command_line(["run", *argv], env=env)
    assert str(raised.value).startswith(message), raised.value


def test_an_absent_kubeconfig_is_not_read_where_it_is_not_used(tmp_path: Path) -> None:
    env = {"FRACGPU_CERTS_KUBECONFIG": "/nonexistent/kc"}
    parse_command_line(["ensure", "--in-cluster"], env=env)
    parse_command_line(["ensure", "--cert-manager"], env=env)
    parse_command_line(["files", f"--dir={tmp_path}"], env=env)


@pytest.fixture
def no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No --kubeconfig, no KUBECONFIG, an empty home, outside a Pod."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "FRACGPU_CERTS_KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("FRACGPU_CERTS_IN_CLUSTER", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("command", ["ensure", "run"])
def test_without_a_kubeconfig_the_message_says_what_to_do(
    no_kubeconfig: Path, caplog: pytest.LogCaptureFixture, command: str
) -> None:
    caplog.set_level(logging.ERROR, logger="fracgpu.certs")
    assert main([command]) == 1
    assert (
        f"cannot load the kubeconfig: no kubeconfig found (~/.kube/config does not exist): {HINT}"
    ) in caplog.text


def test_a_kubeconfig_variable_naming_no_file_is_named(
    no_kubeconfig: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = f"{no_kubeconfig / 'a'}:{no_kubeconfig / 'b'}"
    monkeypatch.setenv("KUBECONFIG", listed)
    assert main(["ensure"]) == 1
    assert f"no kubeconfig found (KUBECONFIG={listed} names no file): {HINT}" in caplog.text


def test_kubeconfig_is_read_when_the_command_runs(
    no_kubeconfig: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Set after the client was imported (it reads KUBECONFIG once, at import).
    monkeypatch.setenv("KUBECONFIG", str(_unreachable_kubeconfig(no_kubeconfig)))
    assert main(["ensure"]) == 1
    assert "the API server is unreachable" in caplog.text
