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

import kubernetes.client
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from fracgpu import names
from tests.chart.render import RendererUnavailableError, render

from .harness.config import APISERVER_VERSION, E2EConfig, _default_cache_dir
from .harness.ports import free_port
from .harness.process import ManagedProcess

# The chart's names of the sidecar's RBAC objects (release fracgpu).
SIDECAR_RBAC = "fracgpu-webhook-scheduler"


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
    local_port: int = 10251,
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
        # Loopback only: with a configuration file 1.20 serves healthz and metrics
        # unauthenticated on every address (:10251) unless told otherwise.
        "healthzBindAddress": f"127.0.0.1:{local_port}",
        "metricsBindAddress": f"127.0.0.1:{local_port}",
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


def install_chart_scheduler_rbac(client: kubernetes.client.ApiClient) -> bool:
    """The chart's RBAC of the scheduler sidecar (queue mode), rendered and applied; False
    when the chart renderer is not available here (the caller runs the scheduler as admin)."""
    try:
        rendered = render(values={"webhook": {"queue": {"enabled": True}}})
    except RendererUnavailableError:
        return False
    rbac = kubernetes.client.RbacAuthorizationV1Api(client)
    create = {
        "ClusterRoleBinding": rbac.create_cluster_role_binding,
        "Role": lambda o: rbac.create_namespaced_role(o["metadata"]["namespace"], o),
        "RoleBinding": lambda o: rbac.create_namespaced_role_binding(o["metadata"]["namespace"], o),
    }
    for obj in rendered.objects():
        if obj["kind"] in create and obj["metadata"]["name"].startswith(SIDECAR_RBAC):
            try:
                create[obj["kind"]](obj)
            except ApiException as error:
                if error.status != 409:
                    raise
    return True


def fracgpu_scheduler(
    binary: Path,
    work: Path,
    kubeconfig: Path,
    extender_port: int,
    env: Mapping[str, str],
    *,
    leader_elect: bool = False,
) -> ManagedProcess:
    work.mkdir(parents=True, exist_ok=True)
    config = work / "scheduler-config.yaml"
    config.write_text(
        yaml.safe_dump(
            scheduler_configuration(
                str(kubeconfig),
                f"http://127.0.0.1:{extender_port}",
                leader_elect=leader_elect,
                local_port=free_port(),  # tests run beside other schedulers on this host
            )
        )
    )
    return ManagedProcess(
        "fracgpu-scheduler",
        [
            str(binary),
            f"--config={config}",
            # No HTTP serving at all (as the chart's sidecar): nothing to authenticate.
            "--secure-port=0",
            "--port=0",
            "--v=2",
        ],
        work / "fracgpu-scheduler.log",
        env,
    )
