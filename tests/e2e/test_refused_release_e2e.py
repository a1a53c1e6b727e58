"""A GPU pod that a later admission step refuses gives its slice back within seconds, not
after the reservation TTL: a real kube-apiserver refuses it (its own validation after the
mutating webhooks, or ResourceQuota after the validating ones), and two real webhook
replicas in cluster mode notice (issue 19)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from .fixtures import NodeFactory
from .harness import ControlPlane
from .harness.resources import create_gpuquota, create_resource_quota
from .webhook_harness import Webhooks, running_webhooks

pytestmark = pytest.mark.e2e
TTL_S = 300  # far longer than the test: only the admission window can free the GPU
WINDOW_S = 2
WHOLE_GPU = {"tencent.com/vcuda-core": "100"}


@pytest.fixture(scope="module")
def webhooks(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Webhooks]:
    extra = [
        "--reservation-ttl-seconds",
        str(TTL_S),
        "--admission-window-seconds",
        str(WINDOW_S),
    ]
    with running_webhooks(
        kube_client,
        control_plane.kubeconfig("webhook"),
        tmp_path_factory.mktemp("refused"),
        extra,
    ) as running:
        yield running


def gpu_pod(name: str, selector: dict[str, str], **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": selector,
            "containers": [
                {
                    "name": "main",
                    "image": "cuda:12",
                    "resources": {"limits": dict(WHOLE_GPU), **container.pop("resources", {})},
                    **container,
                }
            ],
        },
    }


def create(
    client: kubernetes.client.ApiClient, namespace: str, body: dict[str, Any], dry_run: bool = False
) -> Any:
    return kubernetes.client.CoreV1Api(client).create_namespaced_pod(
        namespace, body, dry_run="All" if dry_run else None
    )


def seconds_until_placed(
    client: kubernetes.client.ApiClient, namespace: str, selector: dict[str, str]
) -> float:
    """Creates of a whole-GPU pod until one is admitted (a refused create reserves nothing).
    Real creates, not dry runs: a dry run may be placed by a follower, whose view lacks the
    leader's newest claims; a create is placed by the leader."""
    started = time.monotonic()
    last = ""
    body = gpu_pod("fits", selector, resources={"requests": {"memory": "512Mi"}})
    while time.monotonic() - started < 30:
        try:
            created = create(client, namespace, body)
        except ApiException as error:
            last = error.body or ""
            time.sleep(0.25)
            continue
        took = time.monotonic() - started
        assert created.metadata.annotations["fracgpu.io/assignment"]
        print(f"the refused pod's GPU was placed again after {took:.1f} s (TTL {TTL_S} s)")
        return took
    raise AssertionError(f"the GPU was still held after 30 s: {last}")


def one_gpu_node(nodes: NodeFactory) -> dict[str, str]:
    suffix = uuid.uuid4().hex[:6]
    selector = {"refused-test": suffix}
    nodes.gpu_node(f"refused-{suffix}", gpus=1, labels=selector)
    time.sleep(1.0)  # the replicas' caches see the node
    return selector


@pytest.mark.parametrize("generated", [False, True], ids=["name", "generateName"])
def test_pod_refused_by_resource_quota_after_validation_frees_its_gpu(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
    generated: bool,
) -> None:
    selector = one_gpu_node(nodes)
    create_resource_quota(kube_client, namespace, {"requests.memory": "1Gi"})
    time.sleep(1.0)
    too_big = gpu_pod("too-big", selector, resources={"requests": {"memory": "2Gi"}})
    if generated:  # validation sees the name the API server generated; mutation does not
        too_big["metadata"] = {"generateName": "too-big-"}
    # fracgpu reserves the GPU and validates the pod; ResourceQuota, last, refuses it
    with pytest.raises(ApiException) as refused:
        create(kube_client, namespace, too_big)
    assert refused.value.status == 403
    assert "exceeded quota" in (refused.value.body or "")
    took = seconds_until_placed(kube_client, namespace, selector)
    assert took < TTL_S / 10, f"the GPU came back after {took:.1f} s"


def test_pod_refused_by_the_api_servers_validation_frees_its_gpu(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    selector = one_gpu_node(nodes)
    # the API server validates the object after the mutating webhooks (fracgpu reserved)
    # and before the validating ones: fracgpu's validation never sees this pod
    with pytest.raises(ApiException) as refused:
        create(
            kube_client, namespace, gpu_pod("bad-port", selector, ports=[{"containerPort": 70000}])
        )
    assert refused.value.status == 422
    took = seconds_until_placed(kube_client, namespace, selector)
    assert took < TTL_S / 10, f"the GPU came back after {took:.1f} s"


def test_a_tenant_cannot_grant_itself_high_priority(
    webhooks: Webhooks,
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    """Cluster mode: the grant lives in a GPUQuota, which the tenant (built-in edit role)
    cannot write; a high-priority pod is denied until an administrator grants it."""
    selector = one_gpu_node(nodes)
    tenant = control_plane.api_client("tenant")
    grant = {"grants": {"priority": "high"}}
    with pytest.raises(ApiException) as forbidden:
        create_gpuquota(tenant, namespace, {}, name="mine", **grant)
    assert forbidden.value.status == 403
    share = gpu_pod("high", selector)
    share["metadata"]["annotations"] = {"nvidia.com/priority": "0"}
    share["spec"]["containers"][0]["resources"]["limits"] = {
        "tencent.com/vcuda-core": "30",
        "tencent.com/vcuda-memory": "4",
    }
    with pytest.raises(ApiException) as denied:
        create(tenant, namespace, share)
    assert "spec.grants.priority" in (denied.value.body or "")
    create_gpuquota(kube_client, namespace, {}, name="granted", **grant)  # the administrator
    deadline = time.monotonic() + 10
    while True:  # the leader's GPUQuota cache catches up
        try:
            created = create(tenant, namespace, share)
            break
        except ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)
    assert created.metadata.annotations["fracgpu.io/assignment"]
