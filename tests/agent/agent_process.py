"""Run fracgpu-agent as a real process (on the NVML double or a real GPU) and watch its logs."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.agent.nvml_double import REPO, SHIM_LIBRARY, NvmlDouble
from tests.promtext import scrape

# The capabilities the chart leaves the agent (charts/fracgpu/templates/agent-daemonset.yaml;
# KILL only with the slice audit's kill, which these tests do not need for their own
# children): a test agent that held every capability of root would hide a write or read
# that needs one.
AGENT_CAPABILITIES = ("fowner",)


def as_the_chart_runs_the_agent() -> list[str]:
    """The command prefix that runs the agent as uid 0 with only ``AGENT_CAPABILITIES``
    (setpriv), where this runs as root; nothing otherwise."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        return []
    keep = ",".join(["-all", *(f"+{cap}" for cap in AGENT_CAPABILITIES)])
    return [setpriv, "--inh-caps=-all", f"--bounding-set={keep}", "--no-new-privs"]


class AgentProcess:
    def __init__(
        self,
        *,
        node: str,
        directory: Path,
        double: NvmlDouble | None,
        kubeconfig: Path,
        publish_inventory: bool,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.plugin_dir = directory / "dp"
        self.pod_resources = directory / "pr.sock"
        self.state_dir = directory / "state"
        self.lib_dir = directory / "lib"
        self.node_dir = directory / "node"
        self.pods_dir = directory / "pods"
        args = [
            *as_the_chart_runs_the_agent(),
            sys.executable,
            "-m",
            "agent.cli",
            f"--node-name={node}",
            f"--device-plugin-dir={self.plugin_dir}",
            f"--pod-resources-socket={self.pod_resources}",
            f"--host-lib-dir={self.lib_dir}",
            f"--host-state-dir={self.state_dir}",
            f"--host-node-dir={self.node_dir}",
            f"--kubelet-pods-dir={self.pods_dir}",
            f"--shim-source={SHIM_LIBRARY}",
            f"--kubeconfig={kubeconfig}",
            "--metrics-address=127.0.0.1",
            "--metrics-port=0",
            "--kubelet-poll-seconds=0.1",
            "--health-probe-seconds=0.1",
            "--xid-recovery-seconds=1",
            "--log-level=DEBUG",
            # Not measured unless a test asks (auto): the double's contexts take nothing.
            "--context-overhead-bytes=0",
            *extra,
        ]
        if not publish_inventory:
            args.append("--no-publish-inventory")
        # Without a double the agent uses whatever libnvidia-ml.so.1 the machine has.
        nvml_env = double.env() if double is not None else {}
        env = {**os.environ, **nvml_env, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.logs: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.raw.append(line)
                with contextlib.suppress(json.JSONDecodeError):  # a non-JSON line (traceback)
                    self.logs.append(json.loads(line))
                self._cond.notify_all()

    def wait_log(self, msg: str, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for entry in self.logs:
                    if entry.get("msg") == msg:
                        return entry
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"agent never logged {msg!r}:\n{''.join(self.raw)}")
                self._cond.wait(min(left, 0.2))

    def metrics_port(self) -> int:
        return int(self.wait_log("metrics serving")["port"])

    def scrape(self) -> dict[str, float]:
        """The agent's /metrics now, one value per series (name with its labels)."""
        return scrape(self.metrics_port())

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"agent did not stop on SIGTERM:\n{''.join(self.raw)}") from None
        self._reader.join(timeout=5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


def write_unused_kubeconfig(path: Path) -> Path:
    """A kubeconfig for an API the test never lets the agent reach (no pods looked up)."""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: none\n"
        "clusters: [{name: none, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: none, user: {token: unused}}]\n"
        "contexts: [{name: none, context: {cluster: none, user: none}}]\n"
    )
    return path
