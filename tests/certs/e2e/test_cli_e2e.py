"""`fracgpu-certs ensure` and `run` as processes against the real kube-apiserver."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from ..test_cli import ENTRY_POINT
from .conftest import WebhookConfigurations, core_api

pytestmark = pytest.mark.e2e


def _flags(kubeconfig: Path, namespace: str, configurations: WebhookConfigurations) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        f"--mutating-webhook={configurations.mutating}",
        f"--validating-webhook={configurations.validating}",
    ]


def test_ensure_twice_creates_then_writes_nothing(
    kubeconfig: Path, namespace: str, webhook_configurations: WebhookConfigurations
) -> None:
    flags = _flags(kubeconfig, namespace, webhook_configurations)
    first = subprocess.run(
        [ENTRY_POINT, "ensure", *flags], check=False, capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr
    assert "create-ca, renew-serving: no CA is stored" in first.stderr
    assert f"created Secret {namespace}/fracgpu-webhook-tls" in first.stderr
    second = subprocess.run(
        [ENTRY_POINT, "ensure", *flags], check=False, capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stderr
    assert "nothing to do (no writes)" in second.stderr


def test_run_reconciles_then_stops_cleanly_on_sigterm(
    kube_client: kubernetes.client.ApiClient,
    kubeconfig: Path,
    namespace: str,
    webhook_configurations: WebhookConfigurations,
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    core = core_api(kube_client)
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                ENTRY_POINT,
                "run",
                "--interval=1h",
                *_flags(kubeconfig, namespace, webhook_configurations),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "next check in" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        try:
            core.read_namespaced_secret("fracgpu-webhook-tls", namespace)
        except ApiException as error:  # pragma: no cover - reported as a failure
            pytest.fail(f"the loop did not create the serving Secret: {error}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert "received SIGTERM" in text and text.rstrip().endswith("stopped")
