"""The agent on a real NVIDIA driver (marked gpu; skipped where NVML cannot start)."""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from fracgpu.names import RESOURCE_VCUDA_CORE
from tests.agent.agent_process import AgentProcess, write_unused_kubeconfig
from tests.agent.kubelet import TestKubelet
from tests.agent.nvml_double import REPO, SHIM_LIBRARY

pytestmark = pytest.mark.gpu


def _real_discovery() -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "FRACGPU_FAKE_GPU_CONFIG"}
    result = subprocess.run(
        [sys.executable, "-m", "agent.cli", "discover"],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"no usable NVIDIA driver here: {result.stderr.strip()[-300:]}")
    report: dict[str, Any] = json.loads(result.stdout)
    if not report["devices"]:
        pytest.skip("NVML reports no GPUs")
    return report


def test_discovery_on_the_real_driver() -> None:
    report = _real_discovery()
    print(json.dumps(report, indent=2))  # recorded in the issue note when run on a GPU
    assert report["driverVersion"] and report["cudaDriverVersion"]
    for index, device in enumerate(report["devices"]):
        assert device["index"] == index
        assert device["uuid"].startswith(("GPU-", "MIG-"))
        assert device["memoryMiB"] > 0 and device["model"]
        assert device["usage"]["memory_total_bytes"] >= device["memoryMiB"] << 20


def test_agent_metrics_on_the_real_driver(short_dir: Path) -> None:
    report = _real_discovery()
    if not SHIM_LIBRARY.is_file():
        pytest.skip("shim not built (make -C shim)")
    kubelet = TestKubelet(short_dir / "dp", short_dir / "pr.sock")
    kubelet.start()
    agent = AgentProcess(
        node="gpu-host",
        directory=short_dir,
        double=None,
        kubeconfig=write_unused_kubeconfig(short_dir / "kubeconfig"),
        publish_inventory=False,
    )
    try:
        conn = kubelet.wait_for_plugin(RESOURCE_VCUDA_CORE, timeout=60)
        shared = [d for d in report["devices"] if not d["migEnabled"]]
        assert len(conn.devices) == 100 * len(shared)
        port = agent.metrics_port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        print(text)
        for device in report["devices"]:
            assert f'fracgpu_gpu_memory_total_bytes{{gpu="{device["uuid"]}"' in text
    finally:
        assert agent.stop() == 0
        kubelet.close()
