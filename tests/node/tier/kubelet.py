"""kubelet 1.20 in the node's network namespace, on containerd's CRI socket.

The device-plugin directory is fixed at /var/lib/kubelet/device-plugins in 1.20 (one
kubelet per machine: the tier's tests run serially); everything else kubelet keeps is under
the tier's work directory. kubelet changes kernel sysctls at start; sysctls.py puts them back.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tests.e2e.harness.ports import free_port
from tests.e2e.harness.process import ManagedProcess

from .netns import NODE_IP, NetworkNamespace

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")


class Kubelet:
    def __init__(
        self,
        *,
        binary: Path,
        work: Path,
        netns: NetworkNamespace,
        node_name: str,
        kubeconfig: Path,
        containerd_socket: Path,
        cgroup_root: str,
        env: Mapping[str, str],
    ) -> None:
        self.node_name = node_name
        self.root_dir = work / "kubelet"
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket = self.root_dir / "pod-resources" / "kubelet.sock"
        self.healthz_port = free_port()
        self._netns = netns
        config = work / "kubelet-config.json"
        resolv = work / "resolv.conf"
        resolv.write_text("")  # pods get no DNS servers: nothing to resolve here
        config.write_text(json.dumps(self._config(resolv, cgroup_root), indent=1))
        DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
        self.process = ManagedProcess(
            "kubelet",
            [
                *netns.argv_prefix(),
                str(binary),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.root_dir}",
                f"--cert-dir={work / 'kubelet-pki'}",
                f"--node-ip={NODE_IP}",
                f"--hostname-override={node_name}",
                "--container-runtime=remote",
                f"--container-runtime-endpoint=unix://{containerd_socket}",
                f"--volume-plugin-dir={work / 'volume-plugins'}",
                "--node-labels=fracgpu.io/node-tier=true",
                "--v=2",
            ],
            work / "kubelet.log",
            env,
        )

    def _config(self, resolv: Path, cgroup_root: str) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": cgroup_root,
            "failSwapOn": False,
            "enforceNodeAllocatable": [],
            "makeIPTablesUtilChains": False,
            "resolvConf": str(resolv),
            "clusterDNS": [],
            "maxPods": 30,
            "serializeImagePulls": False,
            # The machine's disk and memory are shared with other work: no evictions and no
            # image garbage collection (the tier's image cannot be pulled again).
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "nodeStatusUpdateFrequency": "2s",
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "5s",
            "fileCheckFrequency": "20s",
            "runtimeRequestTimeout": "60s",
            "volumeStatsAggPeriod": "0s",
            "protectKernelDefaults": False,
        }

    def healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.healthz_port}/healthz"
        try:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            # healthz listens on the namespace's loopback: ask from inside.
            answer: bytes = self._netns.call_inside(lambda: opener.open(url, timeout=2).read())
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False
        return answer.strip() == b"ok"

    def start(self) -> None:
        self.process.start()
        self.process.wait_until(self.healthy, 60, "healthy (/healthz)")

    def stop(self) -> None:
        self.process.stop()
