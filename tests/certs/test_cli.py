"""The command line without an API server: usage errors, cert-manager mode, `files`, and the
controller loop surviving an unreachable API server and stopping cleanly on SIGTERM."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from certs import authority
from certs.cli import main
from fracgpu import __version__

ENTRY_POINT = shutil.which("fracgpu-certs") or str(
    Path(__file__).resolve().parents[2] / ".venv" / "bin" / "fracgpu-certs"
)


def _unreachable_kubeconfig(directory: Path) -> Path:
    """A kubeconfig naming a loopback port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = directory / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}
users:
- name: u
  user: {{token: nothing}}
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
"""
    )
    return path


def test_a_bad_setting_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ensure", "--interval=soon"]) == 2
    assert "interval='soon' is not a duration" in capsys.readouterr().err


def test_cert_manager_mode_does_nothing_and_touches_no_api(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fracgpu.certs")
    kubeconfig = _unreachable_kubeconfig(tmp_path)
    for command in ("ensure", "run"):
        caplog.clear()
        assert main([command, "--cert-manager", f"--kubeconfig={kubeconfig}"]) == 0
        assert "cert-manager mode" in caplog.text
        assert "unreachable" not in caplog.text


def test_ensure_against_an_unreachable_api_fails_with_a_clear_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kubeconfig = _unreachable_kubeconfig(tmp_path)
    assert main(["ensure", f"--kubeconfig={kubeconfig}"]) == 1
    assert "the API server is unreachable" in caplog.text


def test_files_writes_a_verifiable_set(tmp_path: Path) -> None:
    plain, projected = tmp_path / "plain", tmp_path / "projected"
    assert (
        main(["files", f"--dir={plain}", "--namespace=demo", "--extra-ip-addresses=127.0.0.1"]) == 0
    )
    assert main(["files", f"--dir={projected}", "--projected"]) == 0
    for directory in (plain, projected):
        ca = authority.decode_certs((directory / "ca.crt").read_bytes())[0]
        pair = authority.decode_pair(
            (directory / "tls.crt").read_bytes(), (directory / "tls.key").read_bytes()
        )
        assert authority.is_signed_by(pair.cert, ca)
    assert "fracgpu-webhook.demo.svc" in authority.dns_names(
        authority.decode_certs((plain / "tls.crt").read_bytes())[0]
    )
    assert os.readlink(projected / "tls.crt") == "..data/tls.crt"


def test_run_keeps_retrying_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = _unreachable_kubeconfig(tmp_path)
    log = tmp_path / "log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [ENTRY_POINT, "run", f"--kubeconfig={kubeconfig}", "--retry-interval=1h"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "retrying in 1h" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert "received SIGTERM" in text and text.rstrip().endswith("stopped")


@pytest.mark.parametrize("command", ["ensure", "run", "files"])
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "--serving-renew-before" in text and "[30%]" in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"fracgpu-certs {__version__}"


def test_an_unusable_kubeconfig_is_one_clear_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("clusters: [\n")
    assert main(["ensure", f"--kubeconfig={broken}"]) == 1
    assert f"cannot load the kubeconfig: {broken}:2:1: not valid YAML" in caplog.text
    assert "Traceback" not in caplog.text
    capsys.readouterr()
    # a kubeconfig that is not there is a bad setting, refused before anything runs
    assert main(["ensure", f"--kubeconfig={tmp_path / 'absent'}"]) == 2
    assert f"--kubeconfig='{tmp_path / 'absent'}' is not allowed: the file does not exist" in (
        capsys.readouterr().err
    )
