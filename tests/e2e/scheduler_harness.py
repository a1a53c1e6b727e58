"""The stock kube-scheduler 1.20 binary run as fracgpu's second scheduler, calling the
webhook's extender, as the chart's sidecar runs it (same configuration, written by the same
function the chart's ConfigMap is checked against).

Binary: built by scripts/build-kube-node.sh into ~/.cache/fracgpu (or FRACGPU_KUBE_SCHEDULER);
missing, the tests skip (fail in CI), like the control plane's own binaries.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from fracgpu import names

from .harness.config import APISERVER_VERSION, E2EConfig, _default_cache_dir
from .harness.ports import free_port
from .harness.process import ManagedProcess


def scheduler_binary(config: E2EConfig) -> Path:
    env = os.environ
    path = Path(
        env.get("FRACGPU_KUBE_SCHEDULER")
        or _default_cache_dir(env) / f"kube-scheduler-{APISERVER_VERSION}"
    )
    if not (path.is_file() and os.access(path, os.X_OK)):
        message = (
            f"kube-scheduler not found at {path}: run `scripts/build-kube-node.sh` (builds and "
            "caches it) or set FRACGPU_KUBE_SCHEDULER"
        )
        if config.in_ci:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


def scheduler_configuration(
    kubeconfig: str,
    extender_url: str,
    *,
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME,
    resources: Sequence[str] = (names.RESOURCE_VCUDA_CORE, names.RESOURCE_VCUDA_MEMORY),
    leader_elect: bool = False,
    lock_namespace: str = "fracgpu-system",
) -> dict[str, Any]:
    """A KubeSchedulerConfiguration (1.20: v1beta1) with one profile, fracgpu's, whose
    extender filters, prioritizes and binds every pod asking for the canonical resources.
    kube-scheduler leaves those resources to the extender (``ignoredByScheduler``): fracgpu
    counts them per GPU, and its reasons, not "Insufficient vcuda-core", reach the pod."""
    election: dict[str, Any] = {"leaderElect": leader_elect}
    if leader_elect:
        election |= {"resourceNamespace": lock_namespace, "resourceName": scheduler_name}
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1beta1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "leaderElection": election,
        "profiles": [{"schedulerName": scheduler_name}],
        "extenders": [
            {
                "urlPrefix": extender_url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "bindVerb": "bind",
                "weight": 1,
                "enableHTTPS": False,
                "nodeCacheCapable": True,
                "ignorable": False,
                "managedResources": [
                    {"name": name, "ignoredByScheduler": True} for name in resources
                ],
            }
        ],
    }


def fracgpu_scheduler(
    binary: Path, work: Path, kubeconfig: Path, extender_port: int, env: Mapping[str, str]
) -> ManagedProcess:
    work.mkdir(parents=True, exist_ok=True)
    config = work / "scheduler-config.yaml"
    config.write_text(
        yaml.safe_dump(
            scheduler_configuration(str(kubeconfig), f"http://127.0.0.1:{extender_port}")
        )
    )
    return ManagedProcess(
        "fracgpu-scheduler",
        [
            str(binary),
            f"--config={config}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--port=0",
            f"--cert-dir={work / 'certs'}",
            "--v=2",
        ],
        work / "fracgpu-scheduler.log",
        env,
    )
