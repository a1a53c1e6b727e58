"""fracgpu-agent as a process, configured as the chart runs it on a node: its device plugins
in kubelet's device-plugin directory, kubelet's pod-resources socket, the production shim
(libfracgpu.so, not the test build), the agent's own identity limited to the chart's RBAC,
uid 0 with only the chart's capabilities.
The only test configuration is the driver: the NVML double on its library path."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.agent.agent_process import as_the_chart_runs_the_agent
from tests.e2e.harness.process import ManagedProcess

from .kubelet import DEVICE_PLUGIN_DIR

REPO = Path(__file__).resolve().parents[3]
SHIM_BUILD = REPO / "shim" / "build"


class Agent:
    def __init__(
        self,
        *,
        work: Path,
        node_name: str,
        kubeconfig: Path,
        pod_resources_socket: Path,
        kubelet_pods_dir: Path,
        driver_env: Mapping[str, str],
        env: Mapping[str, str],
    ) -> None:
        base = work / "fracgpu"
        self.lib_dir = base / "lib"
        self.state_dir = base / "containers"
        self.node_dir = base / "node"
        self.log_path = work / "agent.log"
        argv = [
            *as_the_chart_runs_the_agent(),  # uid 0 with the chart's one capability
            sys.executable,
            "-m",
            "agent.cli",
            f"--node-name={node_name}",
            f"--device-plugin-dir={DEVICE_PLUGIN_DIR}",
            f"--pod-resources-socket={pod_resources_socket}",
            f"--kubelet-pods-dir={kubelet_pods_dir}",
            f"--host-lib-dir={self.lib_dir}",
            f"--host-state-dir={self.state_dir}",
            f"--host-node-dir={self.node_dir}",
            f"--shim-source={SHIM_BUILD / 'libfracgpu.so'}",
            f"--kubeconfig={kubeconfig}",
            "--metrics-address=127.0.0.1",
            "--metrics-port=0",
            "--kubelet-poll-seconds=0.5",
            "--inventory-resync-seconds=5",
            "--log-level=DEBUG",
            # The double's contexts take nothing: a measurement (auto) would find no figure.
            "--context-overhead-bytes=0",
        ]
        self.process = ManagedProcess(
            "fracgpu-agent",
            argv,
            self.log_path,
            {**env, **driver_env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
        )

    def start(self) -> None:
        self.process.start()

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        self.process.kill()

    def logs(self) -> list[dict[str, Any]]:
        """The agent's JSON log lines (all runs so far), in order."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out
