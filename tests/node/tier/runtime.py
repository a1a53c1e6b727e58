"""containerd (Debian's package) with its CRI plugin for kubelet, runc behind the fake
container toolkit (fake-nvidia-runtime.sh), and the bridge CNI with host-local IPAM, all
with state in the tier's work directory and run inside the node's network namespace."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from tests.e2e.harness.process import ManagedProcess

from .image import IMAGE
from .netns import POD_SUBNET, NetworkNamespace

_HERE = Path(__file__).resolve().parent
CNI_BIN_DIR = Path("/usr/lib/cni")


def write_toolkit_wrapper(
    path: Path,
    *,
    runc: Path,
    driver_dir: Path,
    fake_gpu_dir: Path,
    fake_gpu_config: Path,
    log: Path,
) -> Path:
    text = (_HERE / "fake-nvidia-runtime.sh").read_text()
    for key, value in {
        "RUNC": runc,
        "DRIVER_DIR": driver_dir,
        "FAKE_GPU_DIR": fake_gpu_dir,
        "FAKE_GPU_CONFIG": fake_gpu_config,
        "LOG": log,
    }.items():
        if any(c in str(value) for c in " '\"$\\\n"):
            raise ValueError(f"{key} path {value!r} has characters the wrapper cannot hold")
        text = text.replace(f"@{key}@", str(value))
    path.write_text(text)
    path.chmod(0o755)
    return path


def _cni_config(ipam_dir: Path) -> dict[str, object]:
    return {
        "cniVersion": "0.4.0",
        "name": "fracgpu-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "fgpods0",
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "loopback"},
        ],
    }


class Containerd:
    def __init__(
        self,
        *,
        binary: Path,
        ctr: Path,
        work: Path,
        netns: NetworkNamespace,
        runtime: Path,
        env: Mapping[str, str],
    ) -> None:
        self.dir = work / "containerd"
        self.socket = self.dir / "c.sock"
        self._ctr = ctr
        self._netns = netns
        cni_conf = work / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-fracgpu-node.conflist").write_text(
            json.dumps(_cni_config(work / "cni" / "ipam"), indent=1)
        )
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "config.toml"
        config.write_text(self._config(runtime, cni_conf))
        self.process = ManagedProcess(
            "containerd",
            [*netns.argv_prefix(), str(binary), "--config", str(config)],
            work / "containerd.log",
            env,
        )

    def _config(self, runtime: Path, cni_conf: Path) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{self.dir / "root"}"
state = "{self.dir / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.dir / "t.sock"}"
[debug]
  level = "info"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.dir / "opt"}"
[{cri}]
  sandbox_image = "{IMAGE}"
  # The sandbox lacks CAP_SYS_RESOURCE to lower oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{runtime}"
        Root = "{self.dir / "runc"}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"""

    def ctr(self, *args: str, timeout: float = 60) -> str:
        result = subprocess.run(
            [str(self._ctr), "--address", str(self.socket), "--namespace", "k8s.io", *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def ready(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            self.ctr("version", timeout=5)
        except (RuntimeError, subprocess.TimeoutExpired):
            return False
        return True

    def start(self) -> None:
        self.process.start()
        self.process.wait_until(self.ready, 30, "serving")

    def import_image(self, archive: Path) -> None:
        self.ctr(
            "images", "import", "--base-name", IMAGE.rsplit(":", 1)[0], str(archive), timeout=120
        )

    def stop(self) -> None:
        self.process.stop()

    def remove_everything(self) -> None:
        """Kill and remove every task and container it still holds (teardown)."""
        try:
            tasks = self.ctr("tasks", "ls", "-q", timeout=20).split()
            for task in tasks:
                for args in (("tasks", "kill", "-s", "SIGKILL", task), ("tasks", "delete", task)):
                    try:
                        self.ctr(*args, timeout=20)
                    except (RuntimeError, subprocess.TimeoutExpired):
                        time.sleep(0.2)
            for container in self.ctr("containers", "ls", "-q", timeout=20).split():
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    self.ctr("containers", "delete", container, timeout=20)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
