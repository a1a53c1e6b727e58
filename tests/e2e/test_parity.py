"""What users migrating from HAMi, TKEStack and gpushare write, through a real API server and a
real webhook replica in cluster mode: their dialects, annotations, per-model and per-pool
quotas and per-node settings (GPUNode spec). Each test makes its own GPU nodes with models
no other test uses, and steers its pods there, so tests do not see each other's GPUs."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from fracgpu import codec, names
from fracgpu.model import Assignment

from .fixtures import GPUNodeInfo, NodeFactory
from .harness.resources import create_gpuquota
from .webhook_harness import Webhooks

pytestmark = pytest.mark.e2e
CACHE_SETTLE_S = 1.5  # the webhook's watch caches see new nodes and quotas


@pytest.fixture
def tag(one_webhook: Webhooks) -> str:
    """A model suffix only this test's nodes carry."""
    return f"P{uuid.uuid4().hex[:6].upper()}"


def _pod(
    name: str,
    limits: dict[str, str],
    annotations: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    main = {"name": "main", "image": "cuda:12", "resources": {"limits": limits}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"containers": [main, *(containers or [])]},
    }


def _create(client: kubernetes.client.ApiClient, namespace: str, body: dict[str, Any]) -> Any:
    return kubernetes.client.CoreV1Api(client).create_namespaced_pod(namespace, body)


def _assignment(pod: Any) -> Assignment:
    return codec.decode_assignment(pod.metadata.annotations[names.ANNOTATION_ASSIGNMENT])


def _denial(client: kubernetes.client.ApiClient, namespace: str, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as denied:
        _create(client, namespace, body)
    message: str = json.loads(denied.value.body)["message"]
    return message


def _nodes(nodes: NodeFactory, tag: str, count: int = 1, **kwargs: Any) -> list[GPUNodeInfo]:
    made = [nodes.gpu_node(f"par-{tag.lower()}-{i}", **kwargs) for i in range(count)]
    time.sleep(CACHE_SETTLE_S)
    return made


def _quota(client: kubernetes.client.ApiClient, namespace: str, **spec: Any) -> None:
    create_gpuquota(client, namespace, {}, "parity", **spec)
    time.sleep(CACHE_SETTLE_S)


# -- dialects -------------------------------------------------------------------------------------
def test_gpushare_memory_and_count_become_canonical_resources(
    kube_client: kubernetes.client.ApiClient, namespace: str, nodes: NodeFactory, tag: str
) -> None:
    (node,) = _nodes(nodes, tag, gpus=4, model=f"Tesla T4-{tag}", memory_mib=15360)
    body = _pod(
        "share",
        {names.RESOURCE_GPUSHARE_MEM: "3", names.RESOURCE_GPUSHARE_COUNT: "2"},
        {names.ANNOTATION_USE_MODELS: tag},
    )
    pod = _create(kube_client, namespace, body)
    assignment = _assignment(pod)
    assert assignment.node == node.name
    devices = assignment.containers[0].devices
    assert len({d.uuid for d in devices}) == 2
    assert [d.memory_mib for d in devices] == [3072, 3072]  # GiB by default
    assert pod.spec.containers[0].resources.limits == {names.RESOURCE_VCUDA_MEMORY: "24"}


def test_hami_gputype_and_uuid_annotations_steer_placement(
    kube_client: kubernetes.client.ApiClient, namespace: str, nodes: NodeFactory, tag: str
) -> None:
    a100 = nodes.gpu_node(f"par-{tag.lower()}-a", gpus=2, model=f"NVIDIA A100-{tag}")
    t4 = nodes.gpu_node(f"par-{tag.lower()}-t", gpus=1, model=f"Tesla T4-{tag}", memory_mib=15360)
    time.sleep(CACHE_SETTLE_S)
    hami = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048", "nvidia.com/gpucores": "20"}
    first_a100 = a100.devices[0]["uuid"]
    on_a100 = _create(
        kube_client,
        namespace,
        _pod(
            "a100",
            hami,
            {
                names.HAMI_ANNOTATION_USE_GPUTYPE: f"A100-{tag}",
                names.HAMI_ANNOTATION_NOUSE_GPUUUID: first_a100,
            },
        ),
    )
    (device,) = _assignment(on_a100).containers[0].devices
    assert device.uuid == a100.devices[1]["uuid"]  # the A100 model, not the excluded UUID
    on_t4 = _create(
        kube_client,
        namespace,
        _pod("t4", hami, {names.HAMI_ANNOTATION_USE_GPUUUID: t4.devices[0]["uuid"]}),
    )
    assert _assignment(on_t4).node == t4.name
    message = _denial(
        kube_client,
        namespace,
        _pod("none", hami, {names.HAMI_ANNOTATION_USE_GPUTYPE: f"H100-{tag}"}),
    )
    assert "H100" in message


def test_tkestack_core_limit_annotation_and_hami_priority_limit_are_carried_not_scheduled(
    kube_client: kubernetes.client.ApiClient, namespace: str, nodes: NodeFactory, tag: str
) -> None:
    _nodes(nodes, tag, gpus=1, model=f"NVIDIA A10-{tag}", memory_mib=24576)
    steer = {names.ANNOTATION_USE_MODELS: tag}
    tk = _create(
        kube_client,
        namespace,
        _pod(
            "tk",
            {names.RESOURCE_VCUDA_CORE: "20", names.RESOURCE_VCUDA_MEMORY: "8"},
            {**steer, names.RESOURCE_VCUDA_CORE_LIMIT: "60"},
        ),
    )
    assert _assignment(tk).containers[0].core_limit == 60
    share = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024", "nvidia.com/gpucores": "10"}
    low = {
        "name": "low",
        "image": "cuda:12",
        "resources": {"limits": {**share, names.RESOURCE_HAMI_PRIORITY: "1"}},
    }
    # high priority is granted by an administrator (issue 19), then the webhook sees it
    create_gpuquota(kube_client, namespace, {}, name="grants", grants={"priority": "high"})
    time.sleep(1.0)
    hami = _create(
        kube_client,
        namespace,
        _pod("hami", {**share, names.RESOURCE_HAMI_PRIORITY: "0"}, steer, [low]),
    )
    priorities = {c.container: c.priority for c in _assignment(hami).containers}
    assert {k: v.value if v else None for k, v in priorities.items()} == {
        "main": "high",
        "low": "low",
    }
    # Only what the device plugin offers is left for kube-scheduler to count.
    for created in (tk, hami):
        for container in created.spec.containers:
            assert set(container.resources.limits) == {
                names.RESOURCE_VCUDA_CORE,
                names.RESOURCE_VCUDA_MEMORY,
            }


def test_hami_scheduler_policy_annotation_spreads(
    kube_client: kubernetes.client.ApiClient, namespace: str, nodes: NodeFactory, tag: str
) -> None:
    _nodes(nodes, tag, gpus=2, model=f"NVIDIA L4-{tag}", memory_mib=23034)
    share = {names.RESOURCE_VCUDA_CORE: "10", names.RESOURCE_VCUDA_MEMORY: "4"}
    chosen = set()
    for index in range(2):
        annotations = {
            names.ANNOTATION_USE_MODELS: tag,
            names.HAMI_ANNOTATION_NODE_POLICY: "spread",
        }
        pod = _create(kube_client, namespace, _pod(f"spread-{index}", share, annotations))
        chosen.add(_assignment(pod).containers[0].devices[0].uuid)
    assert len(chosen) == 2


# -- quotas as TKEStack had them ------------------------------------------------------------------
def test_a_per_model_quota_refusal_names_the_model(
    kube_client: kubernetes.client.ApiClient, namespace: str, nodes: NodeFactory, tag: str
) -> None:
    _nodes(nodes, tag, gpus=2, model=f"NVIDIA A100-{tag}")
    _quota(kube_client, namespace, models={f"A100-{tag}": {"cores": 30}})
    steer = {names.ANNOTATION_USE_MODELS: tag}
    share = {names.RESOURCE_VCUDA_CORE: "20", names.RESOURCE_VCUDA_MEMORY: "4"}
    assert _create(kube_client, namespace, _pod("first", share, steer))
    message = _denial(kube_client, namespace, _pod("second", share, steer))
    assert f"A100-{tag}" in message
    assert "cores" in message


def test_a_pool_quota_keeps_pods_in_their_pools(
    kube_client: kubernetes.client.ApiClient, namespace: str, nodes: NodeFactory, tag: str
) -> None:
    pool = f"pool-{tag.lower()}"
    inside = nodes.gpu_node(
        f"par-{tag.lower()}-in", gpus=1, model=f"NVIDIA A30-{tag}", spec={"pool": pool}
    )
    nodes.gpu_node(f"par-{tag.lower()}-out", gpus=4, model=f"NVIDIA A30-{tag}")
    time.sleep(CACHE_SETTLE_S)
    _quota(kube_client, namespace, pools=[pool])
    steer = {names.ANNOTATION_USE_MODELS: tag}
    whole = {names.RESOURCE_VCUDA_CORE: "100"}
    assert _assignment(_create(kube_client, namespace, _pod("in", whole, steer))).node == (
        inside.name
    )
    message = _denial(kube_client, namespace, _pod("more", whole, steer))
    assert pool in message  # the pool is full; the node outside it is not an option


# -- per-node settings ----------------------------------------------------------------------------
def test_a_node_split_count_limits_containers_per_gpu(
    kube_client: kubernetes.client.ApiClient, namespace: str, nodes: NodeFactory, tag: str
) -> None:
    (node,) = _nodes(nodes, tag, gpus=1, model=f"NVIDIA A40-{tag}", spec={"splitCount": 2})
    steer = {names.ANNOTATION_USE_MODELS: tag}
    tiny = {names.RESOURCE_VCUDA_CORE: "5", names.RESOURCE_VCUDA_MEMORY: "1"}
    for index in range(2):
        assert _assignment(_create(kube_client, namespace, _pod(f"s{index}", tiny, steer)))
    message = _denial(kube_client, namespace, _pod("third", tiny, steer))
    assert "2 of 2 slices" in message or node.name in message


def test_two_containers_of_one_pod_may_share_one_gpu(
    kube_client: kubernetes.client.ApiClient, namespace: str, nodes: NodeFactory, tag: str
) -> None:
    (node,) = _nodes(nodes, tag, gpus=1, model=f"NVIDIA A2-{tag}", memory_mib=15360)
    share = {names.RESOURCE_VCUDA_CORE: "20", names.RESOURCE_VCUDA_MEMORY: "4"}
    sidecar = {"name": "side", "image": "cuda:12", "resources": {"limits": share}}
    pod = _create(
        kube_client,
        namespace,
        _pod("pair", share, {names.ANNOTATION_USE_MODELS: tag}, [sidecar]),
    )
    held = _assignment(pod).allocations()
    assert len(held) == 2 and held[0].uuid == held[1].uuid == node.devices[0]["uuid"]
