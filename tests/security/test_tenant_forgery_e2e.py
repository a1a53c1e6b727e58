"""A tenant against admission, on a real kube-apiserver: the `tenant` identity (a plain user
with the built-in edit rights in its namespace) tries to choose its GPUs or raise its slice
through metadata, forged or copied reservations, and environment variables; a webhook
replica runs as fracgpu's own service account with the chart's RBAC and webhook
configurations. Every attempt is refused with a message naming what was wrong, and none
leaves a reservation or charge behind: afterwards the GPUNode's status equals a recount
from the live pods (the reservation TTL is longer than the wait, so a leak would show)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from fracgpu import codec, names
from fracgpu.model import Assignment, ContainerAssignment, GPUAllocation
from tests.e2e.fixtures import GPUNodeInfo, NodeFactory
from tests.e2e.harness import ControlPlane
from tests.e2e.harness.kube import body as kube_body
from tests.e2e.webhook_harness import Webhooks, running_webhooks

pytestmark = pytest.mark.e2e

A100_MIB = 40960
SHARE = {names.RESOURCE_VCUDA_CORE: "10", names.RESOURCE_VCUDA_MEMORY: "4"}
ONLY_FRACGPU = "only fracgpu may set"


@pytest.fixture(scope="module")
def webhooks(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Webhooks]:
    with running_webhooks(
        kube_client,
        control_plane.kubeconfig("webhook"),
        tmp_path_factory.mktemp("webhooks"),
        ["--reservation-ttl-seconds", "120"],
        replicas=1,
    ) as running:
        yield running


@pytest.fixture
def tenant(control_plane: ControlPlane, webhooks: Webhooks) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(control_plane.api_client("tenant"))


@pytest.fixture
def gpu_node(nodes: NodeFactory) -> GPUNodeInfo:
    info = nodes.gpu_node(f"sec-{uuid.uuid4().hex[:6]}", gpus=2, memory_mib=A100_MIB)
    time.sleep(1.0)  # the webhook's caches see the new node
    return info


def pod(
    name: str,
    limits: dict[str, str] | None = None,
    *,
    env: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "cuda:12"}
    if limits:
        container["resources"] = {"limits": limits}
    if env:
        container["env"] = env
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "spec": {"containers": [container], **spec},
    }


def admitted(
    core: kubernetes.client.CoreV1Api, namespace: str, body: dict[str, Any]
) -> kubernetes.client.V1Pod:
    """Create until admitted: a new node may be denied for a moment while caches catch up."""
    last = ""
    for _ in range(50):
        try:
            created: kubernetes.client.V1Pod = core.create_namespaced_pod(
                namespace, kube_body(body)
            )
            return created
        except ApiException as error:
            if error.status not in (400, 403, 500):
                raise
            last = error.body or ""
        time.sleep(0.2)
    raise AssertionError(f"{body['metadata']['name']} never admitted: {last}")


def denied(create: Callable[[], object]) -> str:
    with pytest.raises(ApiException) as refused:
        create()
    assert refused.value.status in (400, 403), refused.value.body
    return str(refused.value.body)


def assignment_of(obj: kubernetes.client.V1Pod) -> Assignment:
    assert obj.metadata is not None and obj.metadata.annotations is not None
    return codec.decode_assignment(obj.metadata.annotations[names.ANNOTATION_ASSIGNMENT])


def env_of(obj: kubernetes.client.V1Pod, field: str = "containers") -> dict[str, dict[str, str]]:
    assert obj.spec is not None
    return {
        c.name: {e.name: e.value for e in (c.env or [])} for c in (getattr(obj.spec, field) or [])
    }


def accounting_settles(kube: kubernetes.client.ApiClient, node: GPUNodeInfo) -> None:
    """The GPUNode's status equals a recount from live pods, with no reservation left."""
    custom = kubernetes.client.CustomObjectsApi(kube)
    core = kubernetes.client.CoreV1Api(kube)
    differences: list[str] = []
    for _ in range(100):
        live: dict[str, tuple[int, int]] = {}
        for item in core.list_pod_for_all_namespaces().items:
            raw = ((item.metadata and item.metadata.annotations) or {}).get(
                names.ANNOTATION_ASSIGNMENT
            )
            if raw is None:
                continue
            for alloc in codec.decode_assignment(raw).allocations():
                cores, memory = live.get(alloc.uuid, (0, 0))
                live[alloc.uuid] = (cores + alloc.cores, memory + alloc.memory_mib)
        obj = custom.get_cluster_custom_object(
            names.GROUP, names.CRD_VERSION, names.GPUNODE_PLURAL, node.name
        )
        status = obj.get("status") or {}
        published = {a["uuid"]: (a["cores"], a["memoryMiB"]) for a in status.get("allocated", [])}
        differences = [
            f"{d['uuid']}: published {published.get(d['uuid'])} != live {live.get(d['uuid'])}"
            for d in node.devices
            if published.get(d["uuid"], (0, 0)) != live.get(d["uuid"], (0, 0))
        ]
        if status.get("reservations"):
            differences.append(f"reservations left: {status['reservations']}")
        if not differences:
            return
        time.sleep(0.3)
    raise AssertionError(f"GPUNode status never equalled a recount: {differences}")


def forged_assignment(node: GPUNodeInfo, reservation_id: str) -> str:
    whole = GPUAllocation(node.devices[0]["uuid"], 100, A100_MIB)
    return codec.encode_assignment(
        Assignment(node.name, reservation_id, (ContainerAssignment("main", (whole,)),))
    )


FORGERIES: dict[str, Callable[[GPUNodeInfo], dict[str, Any]]] = {
    # A whole GPU in a well-formed assignment with a reservation ID that matches it.
    "assignment-with-forged-reservation": lambda n: {
        "annotations": {
            names.ANNOTATION_ASSIGNMENT: forged_assignment(n, "r-forged"),
            names.ANNOTATION_RESERVATION_ID: "r-forged",
        }
    },
    "reservation-id-alone": lambda n: {"annotations": {names.ANNOTATION_RESERVATION_ID: "r-1"}},
    "unknown-fracgpu-annotation": lambda n: {"annotations": {"fracgpu.io/limits": "none"}},
    "node-label": lambda n: {"labels": {names.LABEL_ASSIGNED_NODE: n.name}},
    "assigned-label": lambda n: {"labels": {names.LABEL_MANAGED: "true"}},
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_tenant_cannot_forge_fracgpu_metadata(
    forgery: str,
    tenant: kubernetes.client.CoreV1Api,
    kube_client: kubernetes.client.ApiClient,
    gpu_node: GPUNodeInfo,
    namespace: str,
) -> None:
    metadata = FORGERIES[forgery](gpu_node)
    body = pod("forger", SHARE, **metadata)
    message = denied(lambda: tenant.create_namespaced_pod(namespace, kube_body(body)))
    assert ONLY_FRACGPU in message
    for key in [*metadata.get("annotations", {}), *metadata.get("labels", {})]:
        assert key in message
    accounting_settles(kube_client, gpu_node)


def test_a_tenant_cannot_copy_a_live_pods_assignment(
    tenant: kubernetes.client.CoreV1Api,
    kube_client: kubernetes.client.ApiClient,
    gpu_node: GPUNodeInfo,
    namespace: str,
) -> None:
    original = admitted(tenant, namespace, pod("original", SHARE))
    assert original.metadata is not None
    fracgpu_metadata = {
        kind: {
            k: v for k, v in (getattr(original.metadata, kind) or {}).items() if "fracgpu.io/" in k
        }
        for kind in ("annotations", "labels")
    }
    assert names.ANNOTATION_RESERVATION_ID in fracgpu_metadata["annotations"]
    time.sleep(1.0)  # the replica's pod cache holds the original
    copy = pod("copy", SHARE, **fracgpu_metadata)
    message = denied(lambda: tenant.create_namespaced_pod(namespace, kube_body(copy)))
    assert ONLY_FRACGPU in message and names.ANNOTATION_ASSIGNMENT in message
    accounting_settles(kube_client, gpu_node)


def _raise_cores(annotations: dict[str, str]) -> dict[str, str | None]:
    forged = json.loads(annotations[names.ANNOTATION_ASSIGNMENT])
    forged["containers"][0]["devices"][0]["cores"] = 100
    return {names.ANNOTATION_ASSIGNMENT: json.dumps(forged)}


EDITS: dict[str, Callable[[dict[str, str]], dict[str, Any]]] = {
    "raise-cores": lambda a: {"annotations": _raise_cores(a)},
    "swap-reservation-id": lambda a: {"annotations": {names.ANNOTATION_RESERVATION_ID: "r-other"}},
    "drop-assignment": lambda a: {"annotations": {names.ANNOTATION_ASSIGNMENT: None}},
    "add-fracgpu-annotation": lambda a: {"annotations": {"fracgpu.io/memory": "40960"}},
    "relabel-node": lambda a: {"labels": {names.LABEL_ASSIGNED_NODE: "elsewhere"}},
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_tenant_cannot_edit_fracgpu_metadata_of_its_pod(
    edit: str,
    tenant: kubernetes.client.CoreV1Api,
    kube_client: kubernetes.client.ApiClient,
    gpu_node: GPUNodeInfo,
    namespace: str,
) -> None:
    placed = admitted(tenant, namespace, pod("placed", SHARE))
    assert placed.metadata is not None
    before = dict(placed.metadata.annotations or {}), dict(placed.metadata.labels or {})
    change = EDITS[edit](before[0])
    message = denied(lambda: tenant.patch_namespaced_pod("placed", namespace, {"metadata": change}))
    assert ONLY_FRACGPU in message
    now = tenant.read_namespaced_pod("placed", namespace)
    assert now.metadata is not None
    assert (now.metadata.annotations or {}, now.metadata.labels or {}) == before
    accounting_settles(kube_client, gpu_node)


def test_a_tenant_cannot_reach_the_status_subresource(
    tenant: kubernetes.client.CoreV1Api, gpu_node: GPUNodeInfo, namespace: str
) -> None:
    # The webhook is registered for pods, not pods/status: RBAC must keep tenants out of it.
    admitted(tenant, namespace, pod("placed", SHARE))
    with pytest.raises(ApiException) as refused:
        tenant.patch_namespaced_pod_status(
            "placed",
            namespace,
            {"metadata": {"annotations": {names.ANNOTATION_RESERVATION_ID: "r-x"}}},
        )
    assert refused.value.status == 403


VARIABLES: dict[str, dict[str, Any]] = {
    "visible-devices-all": {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
    "visible-devices-other-gpu": {
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-00000000-0000-0000-0000-0"}]
    },
    "visible-devices-from-field": {
        "env": [
            {
                "name": "NVIDIA_VISIBLE_DEVICES",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
            }
        ]
    },
    "ld-preload": {"env": [{"name": "LD_PRELOAD", "value": "/tmp/mine.so"}]},
    "test-limits-path": {"env": [{"name": "FRACGPU_TEST_LIMITS_PATH", "value": "/tmp/l"}]},
    "made-up-shim-variable": {"env": [{"name": "FRACGPU_MEMORY_LIMIT_MAX", "value": "1Ti"}]},
    "init-container": {
        "initContainers": [
            {"name": "setup", "image": "x", "env": [{"name": "FRACGPU_REGION", "value": "/"}]}
        ]
    },
}


@pytest.mark.parametrize("variable", sorted(VARIABLES))
@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-pod", "pod-without-gpu"])
def test_a_tenant_cannot_set_reserved_variables(
    variable: str,
    gpu: bool,
    tenant: kubernetes.client.CoreV1Api,
    kube_client: kubernetes.client.ApiClient,
    gpu_node: GPUNodeInfo,
    namespace: str,
) -> None:
    spec = dict(VARIABLES[variable])
    body = pod("env", SHARE if gpu else None, env=spec.pop("env", None), **spec)
    message = denied(lambda: tenant.create_namespaced_pod(namespace, kube_body(body)))
    assert ONLY_FRACGPU in message
    names_set = [e["name"] for c in (*body["spec"]["containers"], *body["spec"].get(
        "initContainers", [])) for e in c.get("env", [])]  # fmt: skip
    assert all(f"variable {n}" in message for n in names_set), message
    accounting_settles(kube_client, gpu_node)


def test_variables_that_only_lower_a_limit_are_allowed(
    tenant: kubernetes.client.CoreV1Api, gpu_node: GPUNodeInfo, namespace: str
) -> None:
    lowering = [
        {"name": names.ENV_SHIM_MEMORY_LIMIT, "value": "1Gi"},
        {"name": names.ENV_SHIM_CORE_LIMIT, "value": "5"},
        {"name": names.ENV_SHIM_LOG_LEVEL, "value": "debug"},
    ]
    placed = admitted(tenant, namespace, pod("lowering", SHARE, env=lowering))
    env = env_of(placed)["main"]
    assert {e["name"]: e["value"] for e in lowering}.items() <= env.items()


def test_containers_see_exactly_their_gpus_or_none(
    tenant: kubernetes.client.CoreV1Api, nodes: NodeFactory, namespace: str
) -> None:
    node = nodes.gpu_node(f"sec-{uuid.uuid4().hex[:6]}", gpus=3, memory_mib=A100_MIB)
    time.sleep(1.0)
    # envFrom could carry NVIDIA_VISIBLE_DEVICES=all; fracgpu's explicit entry wins over it.
    tenant.create_namespaced_config_map(
        namespace,
        kube_body({"metadata": {"name": "all-gpus"}, "data": {names.ENV_VISIBLE_DEVICES: "all"}}),
    )
    sidecar = {"name": "sidecar", "image": "x", "envFrom": [{"configMapRef": {"name": "all-gpus"}}]}
    init = {"name": "setup", "image": "x", "envFrom": [{"configMapRef": {"name": "all-gpus"}}]}
    body = pod("mixed", SHARE, initContainers=[init])
    body["spec"]["containers"].append(sidecar)
    mixed = admitted(tenant, namespace, body)
    (slice_,) = assignment_of(mixed).allocations()
    visible = {c: e.get(names.ENV_VISIBLE_DEVICES) for c, e in env_of(mixed).items()}
    assert visible == {"main": slice_.uuid, "sidecar": names.VISIBLE_DEVICES_NONE}
    assert env_of(mixed, "init_containers") == {
        "setup": {names.ENV_VISIBLE_DEVICES: names.VISIBLE_DEVICES_NONE}
    }

    whole = admitted(tenant, namespace, pod("two-gpus", {names.RESOURCE_HAMI_GPU: "2"}))
    uuids = [a.uuid for a in assignment_of(whole).allocations()]
    assert len(set(uuids)) == 2 and set(uuids) <= {d["uuid"] for d in node.devices}
    assert slice_.uuid not in uuids  # the shared GPU is not a free whole one
    shown = env_of(whole)["main"][names.ENV_VISIBLE_DEVICES]
    assert sorted(shown.split(",")) == sorted(uuids)

    plain = admitted(tenant, namespace, pod("no-gpu"))
    assert env_of(plain) == {"main": {names.ENV_VISIBLE_DEVICES: names.VISIBLE_DEVICES_NONE}}
