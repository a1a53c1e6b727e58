"""The whole admission path on a real control plane: pods created through the API server,
mutated and validated by two real webhook replicas in cluster mode."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from fracgpu import codec, names

from .fixtures import NodeFactory
from .harness import ControlPlane
from .harness.kube import body as kube_body
from .harness.resources import (
    FRACGPU_GROUP,
    FRACGPU_VERSION,
    create_gpuquota,
    create_resource_quota,
    gpuquota_used,
)
from .webhook_harness import FRACGPU_NAMESPACE, Webhooks, running_webhooks, wait_placing

pytestmark = pytest.mark.e2e
A100 = 40960
RESERVATION_TTL_S = 15
# The replicas run with --gpu-node-taint: GPU pods get its toleration, pods without GPUs that
# tolerate it are refused. Nodes without the taint are unaffected.
GPU_NODE_TAINT = "fracgpu.io/gpu-node"
LEASE = "fracgpu-webhook"


@pytest.fixture(scope="module")
def webhooks(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Webhooks]:
    # a short TTL lets orphaned reservations (creates lost to a fault) expire within a test;
    # the webhook's own service account with exactly the chart's RBAC proves it suffices
    extra = [
        "--reservation-ttl-seconds",
        str(RESERVATION_TTL_S),
        "--gpu-node-taint",
        GPU_NODE_TAINT,
    ]
    with running_webhooks(
        kube_client,
        control_plane.kubeconfig("webhook"),
        tmp_path_factory.mktemp("webhooks"),
        extra,
    ) as running:
        yield running


def pod(name: str, limits: dict[str, str], **extra: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "cuda:12", "resources": {"limits": limits}}
    container.update(extra.pop("container", {}))
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **extra.pop("metadata", {})},
        "spec": {"containers": [container], **extra.pop("spec", {})},
    }
    return body


def create(
    client: kubernetes.client.ApiClient, namespace: str, body: dict[str, Any], dry_run: bool = False
) -> dict[str, Any]:
    core = kubernetes.client.CoreV1Api(client)
    created = core.create_namespaced_pod(namespace, body, dry_run="All" if dry_run else None)
    return dict(client.sanitize_for_serialization(created))


def env_of(pod_obj: dict[str, Any], container: str = "main") -> dict[str, str]:
    for c in pod_obj["spec"]["containers"]:
        if c["name"] == container:
            return {e["name"]: e.get("value", "") for e in c.get("env", [])}
    raise AssertionError(f"no container {container}")


def live_sums(client: kubernetes.client.ApiClient) -> dict[str, tuple[int, int]]:
    """Per GPU: (cores, memory MiB) summed over every live pod's assignment."""
    pods = kubernetes.client.CoreV1Api(client).list_pod_for_all_namespaces().items
    sums: dict[str, tuple[int, int]] = {}
    for item in pods:
        raw = (item.metadata.annotations or {}).get(names.ANNOTATION_ASSIGNMENT)
        if raw is None or item.metadata.deletion_timestamp is not None:
            continue
        for alloc in codec.decode_assignment(raw).allocations():
            cores, memory = sums.get(alloc.uuid, (0, 0))
            sums[alloc.uuid] = (cores + alloc.cores, memory + alloc.memory_mib)
    return sums


def gpunode(client: kubernetes.client.ApiClient, name: str) -> dict[str, Any]:
    return dict(
        kubernetes.client.CustomObjectsApi(client).get_cluster_custom_object(
            FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", name
        )
    )


def wait_until(predicate: Any, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_tkestack_and_hami_pods_are_placed_pinned_and_annotated(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    node = nodes.gpu_node(f"flow-{uuid.uuid4().hex[:6]}", gpus=2, memory_mib=A100)
    uuids = {d["uuid"] for d in node.devices}
    time.sleep(1.0)  # the replicas' GPUNode caches see the new node
    tke = create(
        kube_client,
        namespace,
        pod("tke", {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "16"}),
    )
    hami = create(
        kube_client,
        namespace,
        pod(
            "hami",
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "20"},
        ),
    )
    for obj, cores, memory in ((tke, 30, 4096), (hami, 20, 3072)):
        read_back = dict(
            kube_client.sanitize_for_serialization(
                kubernetes.client.CoreV1Api(kube_client).read_namespaced_pod(
                    obj["metadata"]["name"], namespace
                )
            )
        )
        annotations = read_back["metadata"]["annotations"]
        assignment = codec.decode_assignment(annotations[names.ANNOTATION_ASSIGNMENT])
        assert assignment.node == node.name
        (alloc,) = assignment.allocations()
        assert alloc.uuid in uuids and (alloc.cores, alloc.memory_mib) == (cores, memory)
        assert env_of(read_back)[names.ENV_VISIBLE_DEVICES] == alloc.uuid
        limits = read_back["spec"]["containers"][0]["resources"]["limits"]
        assert limits[names.RESOURCE_VCUDA_CORE] == str(cores)
        assert limits[names.RESOURCE_VCUDA_MEMORY] == str(memory // 256)
        terms = read_back["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        # pinned by the Node object's name, in every (ORed) term
        assert terms and all(
            {"key": "metadata.name", "operator": "In", "values": [node.name]}
            in t.get("matchFields", [])
            for t in terms
        )


def test_tampering_and_forged_variables_are_denied(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    nodes.gpu_node(f"tamper-{uuid.uuid4().hex[:6]}", gpus=1, memory_mib=A100)
    time.sleep(1.0)
    admitted = create(
        kube_client,
        namespace,
        pod("victim", {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "4"}),
    )
    core = kubernetes.client.CoreV1Api(kube_client)
    forged = json.loads(admitted["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT])
    forged["containers"][0]["devices"][0]["cores"] = 100
    with pytest.raises(ApiException) as denied:
        core.patch_namespaced_pod(
            "victim",
            namespace,
            {"metadata": {"annotations": {names.ANNOTATION_ASSIGNMENT: json.dumps(forged)}}},
        )
    assert denied.value.status in (400, 403) and names.ANNOTATION_ASSIGNMENT in denied.value.body
    with pytest.raises(ApiException) as denied:
        create(
            kube_client,
            namespace,
            pod(
                "forger",
                {"tencent.com/vcuda-core": "10"},
                container={"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
            ),
        )
    assert "NVIDIA_VISIBLE_DEVICES" in denied.value.body


def test_dry_run_reserves_nothing(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    node = nodes.gpu_node(f"dry-{uuid.uuid4().hex[:6]}", gpus=1, memory_mib=A100)
    time.sleep(1.0)
    mutated = create(
        kube_client,
        namespace,
        pod("dry", {"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "8"}),
        dry_run=True,
    )
    assert names.ANNOTATION_ASSIGNMENT in mutated["metadata"]["annotations"]
    assert not (gpunode(kube_client, node.name).get("status") or {}).get("reservations")
    assert live_sums(kube_client).keys().isdisjoint({d["uuid"] for d in node.devices})


def test_burst_of_300_pods_from_many_threads_never_overcommits(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    prefix = f"burst-{uuid.uuid4().hex[:4]}"
    infos = [nodes.gpu_node(f"{prefix}-{i:02d}", gpus=1, memory_mib=16384) for i in range(20)]
    capacity = {d["uuid"]: (100, d["memoryMiB"]) for info in infos for d in info.devices}
    time.sleep(1.5)
    shapes = [
        ({"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "16"}),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6000", "nvidia.com/gpucores": "25"}),
        ({"tencent.com/vcuda-core": "100"}),
    ]
    outcomes: dict[str, list[str]] = {"admitted": [], "rejected": []}
    lock = threading.Lock()

    def one(i: int) -> None:
        body = pod(f"{prefix}-p{i:03d}", shapes[i % len(shapes)])
        try:
            create(kube_client, namespace, body)
            verdict, detail = "admitted", body["metadata"]["name"]
        except ApiException as error:
            verdict, detail = "rejected", error.body or ""
        with lock:
            outcomes[verdict].append(detail)

    def counts(verdict: str) -> dict[str, float]:
        return {r.name: r.admissions("mutate", verdict) for r in webhooks.replicas}

    placed_before, forwarded_before = counts("patched"), counts("forwarded")
    with ThreadPoolExecutor(max_workers=24) as pool:
        list(pool.map(one, range(300)))
    assert outcomes["admitted"], outcomes["rejected"][:3]
    for body in outcomes["rejected"]:
        assert "no GPU has room for this pod now" in body, body[:500]
    sums = live_sums(kube_client)
    for gpu, (cores, memory) in sums.items():
        if gpu in capacity:
            assert cores <= capacity[gpu][0] and memory <= capacity[gpu][1], (gpu, cores, memory)
    assert all(count > 0 for count in webhooks.balancer.connections.values()), (
        "both replicas must have served the burst"
    )
    # Only the leader placed: the other replica forwarded every GPU pod it was sent.
    placed = {name: n - placed_before[name] for name, n in counts("patched").items()}
    forwarded = {name: n - forwarded_before[name] for name, n in counts("forwarded").items()}
    placers = [name for name, count in placed.items() if count]
    assert len(placers) == 1, (placed, forwarded)
    assert all(count for name, count in forwarded.items() if name not in placers), forwarded
    core = kubernetes.client.CoreV1Api(kube_client)
    for name in outcomes["admitted"]:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def clean() -> bool:
        return all(
            not (gpunode(kube_client, i.name).get("status") or {}).get("reservations")
            for i in infos
        )

    wait_until(clean, "every reservation pruned after the burst", timeout_s=60)
    wait_until(
        lambda: all(
            gpunode(kube_client, i.name)["status"]["summary"]["compute"] == "0/100" for i in infos
        ),
        "allocation summaries back to zero",
        timeout_s=30,
    )


def test_plain_resource_quota_on_canonical_resources_keeps_working(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    nodes.gpu_node(f"rq-{uuid.uuid4().hex[:6]}", gpus=2, memory_mib=A100)
    create_resource_quota(kube_client, namespace, {"requests.tencent.com/vcuda-core": "50"})
    time.sleep(1.0)
    # A HAMi pod is rewritten to canonical resources, which ResourceQuota then counts.
    create(
        kube_client,
        namespace,
        pod(
            "first",
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem": "1024"},
        ),
    )
    with pytest.raises(ApiException) as refused:
        create(
            kube_client,
            namespace,
            pod("second", {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "4"}),
        )
    assert refused.value.status == 403
    assert "exceeded quota" in (refused.value.body or "")


def test_node_selector_and_taints_steer_placement_in_cluster_mode(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    suffix = uuid.uuid4().hex[:6]
    tainted = nodes.gpu_node(
        f"tainted-{suffix}", gpus=1, memory_mib=A100, labels={"pool": f"train-{suffix}"}
    )
    plain = nodes.gpu_node(
        f"plain-{suffix}", gpus=1, memory_mib=A100, labels={"pool": f"train-{suffix}"}
    )
    kubernetes.client.CoreV1Api(kube_client).patch_node(
        tainted.name,
        {"spec": {"taints": [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}},
    )
    other = nodes.gpu_node(f"other-{suffix}", gpus=1, memory_mib=A100)
    time.sleep(1.5)
    limits = {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "4"}
    for i in range(3):
        placed = create(
            kube_client,
            namespace,
            pod(f"sel-{i}", limits, spec={"nodeSelector": {"pool": f"train-{suffix}"}}),
        )
        node = codec.decode_assignment(
            placed["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT]
        ).node
        assert node == plain.name, "untolerated taint or unselected node chosen"
    tolerating = create(
        kube_client,
        namespace,
        pod(
            "tolerates",
            {"tencent.com/vcuda-core": "100"},
            spec={
                "nodeSelector": {"pool": f"train-{suffix}"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            },
        ),
    )
    node = codec.decode_assignment(
        tolerating["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT]
    ).node
    assert node == tainted.name  # the plain node's GPU is shared, the tainted one is free
    del other


def test_a_gpu_node_tainted_with_a_resource_name_takes_the_pods_that_ask_for_it(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    """docs/operations.md, "Keep GPU nodes for GPU pods": kube-apiserver's
    ExtendedResourceToleration runs before the webhooks, so fracgpu places a pod that asks
    for the taint's resource on the tainted node. A pod of another dialect, and a pod without
    GPUs, get no toleration: the first is refused there, the second stays off it."""
    suffix = uuid.uuid4().hex[:6]
    pool = {"pool": f"gpu-only-{suffix}"}
    tainted = nodes.gpu_node(f"gpu-only-{suffix}", gpus=2, memory_mib=A100, labels=pool)
    taint = {"key": names.RESOURCE_VCUDA_CORE, "value": "present", "effect": "NoSchedule"}
    kubernetes.client.CoreV1Api(kube_client).patch_node(tainted.name, {"spec": {"taints": [taint]}})
    time.sleep(1.5)  # the replicas' node caches see the node and its taint
    tolerated = {"key": names.RESOURCE_VCUDA_CORE, "operator": "Exists", "effect": "NoSchedule"}

    tke = create(
        kube_client,
        namespace,
        pod(
            "tke-on-tainted",
            {names.RESOURCE_VCUDA_CORE: "30", names.RESOURCE_VCUDA_MEMORY: "16"},
            spec={"nodeSelector": pool},
        ),
    )
    assert tolerated in tke["spec"]["tolerations"]
    placed = codec.decode_assignment(tke["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT])
    assert placed.node == tainted.name

    with pytest.raises(ApiException) as refused:
        create(
            kube_client,
            namespace,
            pod(
                "hami-on-tainted",
                {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "20"},
                spec={"nodeSelector": pool},
            ),
        )
    message = refused.value.body or ""
    assert "not tolerated" in message and names.RESOURCE_VCUDA_CORE in message, message

    cpu_only = create(kube_client, namespace, pod("cpu-only", {"cpu": "1"}))
    keys = {t.get("key") for t in cpu_only["spec"].get("tolerations") or []}
    assert names.RESOURCE_VCUDA_CORE not in keys


def test_fracgpus_gpu_node_taint_takes_gpu_pods_of_any_dialect_and_no_other_pod(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    """docs/operations.md, "Keep GPU nodes for GPU pods", with --gpu-node-taint: the API
    server applies fracgpu's toleration to pods of both dialects, which are then placed on
    the tainted node, and refuses a pod without GPUs that tolerates the taint."""
    suffix = uuid.uuid4().hex[:6]
    pool = {"pool": f"kept-{suffix}"}
    tainted = nodes.gpu_node(f"kept-{suffix}", gpus=2, memory_mib=A100, labels=pool)
    taint = {"key": GPU_NODE_TAINT, "value": "present", "effect": "NoSchedule"}
    kubernetes.client.CoreV1Api(kube_client).patch_node(tainted.name, {"spec": {"taints": [taint]}})
    time.sleep(1.5)  # the replicas' node caches see the node and its taint
    written = {"key": GPU_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}
    for name, limits in (
        ("tke-kept", {names.RESOURCE_VCUDA_CORE: "30", names.RESOURCE_VCUDA_MEMORY: "16"}),
        ("hami-kept", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
    ):
        created = create(kube_client, namespace, pod(name, limits, spec={"nodeSelector": pool}))
        assert created["spec"]["tolerations"].count(written) == 1
        annotations = created["metadata"]["annotations"]
        assert codec.decode_assignment(annotations[names.ANNOTATION_ASSIGNMENT]).node == (
            tainted.name
        )

    for tolerations in ([written], [{"operator": "Exists"}]):
        with pytest.raises(ApiException) as refused:
            create(
                kube_client,
                namespace,
                pod("cpu-on-gpu-node", {"cpu": "1"}, spec={"tolerations": tolerations}),
            )
        assert refused.value.status == 403
        assert "gpu-node-taint" in (refused.value.body or "")


def test_a_pod_as_large_as_the_api_server_stores_is_denied_by_name_beside_ordinary_ones(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    """Through a real kube-apiserver: a 1.2 MB pod of 20,000 tolerations is denied naming the
    limit (screened in the webhook's worker), ordinary pods sent meanwhile are placed, and
    duplicate container names get fracgpu's denial, not an internal error."""
    nodes.gpu_node(f"large-{uuid.uuid4().hex[:6]}", gpus=1, memory_mib=A100)
    time.sleep(1.0)
    limits = {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "4"}
    tolerations = [{"key": f"k{i}-{'x' * 24}", "operator": "Exists"} for i in range(20_000)]
    huge = pod("huge", limits, spec={"tolerations": tolerations})
    assert len(json.dumps(huge)) > 1_000_000
    with ThreadPoolExecutor(4) as pool:
        attack = pool.submit(create, kube_client, namespace, huge)
        ordinary = [
            pool.submit(create, kube_client, namespace, pod(f"beside-{i}", limits), True)
            for i in range(6)
        ]
        for placed in ordinary:
            assert names.ANNOTATION_ASSIGNMENT in placed.result()["metadata"]["annotations"]
        with pytest.raises(ApiException) as denied:
            attack.result()
    assert denied.value.status == 403
    message = json.loads(denied.value.body)["message"]
    # the API server adds four of its own: DefaultTolerationSeconds two, and
    # ExtendedResourceToleration one per extended resource the pod asks for
    assert "20004 tolerations, over fracgpu's limit of 256 (setting max-tolerations)" in message
    twins = pod("twins", limits)
    twins["spec"]["containers"].append(dict(twins["spec"]["containers"][0]))
    with pytest.raises(ApiException) as denied:
        create(kube_client, namespace, twins)
    message = json.loads(denied.value.body)["message"]
    assert 'container name "main" is used twice' in message, message


def test_an_assignment_copied_from_a_live_pod_is_denied(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    nodes.gpu_node(f"copy-{uuid.uuid4().hex[:6]}", gpus=1, memory_mib=A100)
    time.sleep(1.0)
    original = create(
        kube_client,
        namespace,
        pod("original", {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "4"}),
    )
    annotations = {
        k: v for k, v in original["metadata"]["annotations"].items() if k.startswith("fracgpu.io/")
    }
    time.sleep(1.0)  # the replicas' pod caches see the original
    copy = pod(
        "copy",
        {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "4"},
        metadata={"annotations": annotations},
    )
    with pytest.raises(ApiException) as denied:
        create(kube_client, namespace, copy)
    assert "only fracgpu may set" in (denied.value.body or "")


def recount(client: kubernetes.client.ApiClient, namespace: str) -> dict[str, int]:
    pods = kubernetes.client.CoreV1Api(client).list_namespaced_pod(namespace).items
    cores = memory = gpus = 0
    for item in pods:
        raw = (item.metadata.annotations or {}).get(names.ANNOTATION_ASSIGNMENT)
        if raw is None:
            continue
        for alloc in codec.decode_assignment(raw).allocations():
            cores += alloc.cores
            memory += alloc.memory_mib
            gpus += alloc.cores >= 100
    return {"cores": cores, "memoryMiB": memory, "gpus": gpus}


FAULTS = ["replica-kill-and-apiserver-restart", "etcd-restart", "lease-stolen"]


def inject(fault: str, webhooks: Webhooks, control_plane: ControlPlane,
           kube_client: kubernetes.client.ApiClient) -> None:  # fmt: skip
    if fault == "replica-kill-and-apiserver-restart":
        # SIGKILL the leader mid-burst: the claims it held in memory die with it.
        leader = next((r for r in webhooks.replicas if r.placing()), webhooks.replicas[0])
        leader.kill()
        control_plane.restart_apiserver()
    elif fault == "etcd-restart":
        control_plane.restart_etcd()
    else:
        # Another holder takes the Lease: the controllers stop until it expires and a
        # replica takes over again.
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        kubernetes.client.CoordinationV1Api(kube_client).patch_namespaced_lease(
            LEASE, FRACGPU_NAMESPACE,
            kube_body({"spec": {"holderIdentity": "intruder", "renewTime": now}}),
        )  # fmt: skip


def test_every_replica_exports_quota_limits_and_use(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    nodes.gpu_node(f"quota-metrics-{uuid.uuid4().hex[:4]}", gpus=1, memory_mib=A100)
    create_gpuquota(kube_client, namespace, {"cores": 400, "memoryMiB": 8192}, name="metrics")
    time.sleep(1.5)  # the replicas' caches see the new node and quota
    ask = {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"}
    create(kube_client, namespace, pod("quota-metrics", ask))
    labels = f'model="",namespace="{namespace}",quota="metrics",resource="%s"'
    for replica in webhooks.replicas:
        # The leader counts the charge at once, followers once the recount wrote it.
        wait_until(
            lambda r=replica: (
                r.metric("fracgpu_quota_used{" + labels % "cores" + "}") == 30
                and r.metric("fracgpu_quota_used{" + labels % "memoryMiB" + "}") == 2048
                and r.metric("fracgpu_quota_hard{" + labels % "cores" + "}") == 400
            ),
            f"{replica.name} exporting the GPUQuota's use",
        )


@pytest.mark.parametrize("fault", FAULTS)
def test_faults_lose_no_accounting(
    fault: str,
    webhooks: Webhooks,
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    """Runs last in this module: it kills a replica, restarts the API server or etcd, or
    steals the controllers' Lease, in the middle of a burst of creates."""
    wait_placing(webhooks.replicas)  # the previous fault may have moved leadership
    prefix = f"fault-{uuid.uuid4().hex[:4]}"
    infos = [nodes.gpu_node(f"{prefix}-{i}", gpus=2, memory_mib=A100) for i in range(5)]
    create_gpuquota(kube_client, namespace, {"cores": 2000})
    time.sleep(1.5)
    errors: list[str] = []

    def one(i: int) -> None:
        body = pod(
            f"{prefix}-p{i:03d}", {"tencent.com/vcuda-core": "20", "tencent.com/vcuda-memory": "8"}
        )
        for _ in range(60):  # a controller would retry until the control plane is back
            try:
                create(kube_client, namespace, body)
                return
            except ApiException as error:
                if error.status == 409 and "AlreadyExists" in (error.body or ""):
                    return
                errors.append(str(error.status))
            except Exception as error:
                errors.append(type(error).__name__)
            time.sleep(0.5)

    with ThreadPoolExecutor(max_workers=12) as pool:
        futures = [pool.submit(one, i) for i in range(60)]
        time.sleep(1.0)
        inject(fault, webhooks, control_plane, kube_client)
        for future in futures:
            future.result()
    for replica in webhooks.replicas:
        if replica.process is not None and replica.process.poll() is not None:
            replica.start().wait_ready()
    wait_placing(webhooks.replicas)
    # A stolen Lease stops placement only at the leader's next renewal (up to 5 s later),
    # when the burst may be over: no create has to fail for it.
    if fault != "lease-stolen":
        assert errors, "the faults should have been felt by some creates"
    sums = live_sums(kube_client)
    for info in infos:
        for device in info.devices:
            cores, memory = sums.get(device["uuid"], (0, 0))
            assert cores <= 100 and memory <= A100

    differences: list[str] = []

    def settled() -> bool:
        differences.clear()
        now_live = live_sums(kube_client)
        used, counted = gpuquota_used(kube_client, namespace), recount(kube_client, namespace)
        if used != counted:
            differences.append(f"quota used {used} != recount {counted}")
        for info in infos:
            status = gpunode(kube_client, info.name).get("status") or {}
            if status.get("reservations"):
                differences.append(f"{info.name} still holds {status['reservations']}")
            published = {
                a["uuid"]: (a["cores"], a["memoryMiB"]) for a in status.get("allocated", [])
            }
            for device in info.devices:
                live = now_live.get(device["uuid"], (0, 0))
                if published.get(device["uuid"]) != live:
                    differences.append(
                        f"{device['uuid']}: {published.get(device['uuid'])} != {live}"
                    )
        return not differences

    try:
        wait_until(
            settled,
            "GPUNode and GPUQuota status equal to a recount from live pods",
            timeout_s=RESERVATION_TTL_S + 45,
        )
    except AssertionError as error:
        raise AssertionError(f"{error}: {differences}") from None
    coordination = kubernetes.client.CoordinationV1Api(kube_client)
    replicas = {r.name for r in webhooks.replicas}

    def holder() -> str:
        return str(
            coordination.read_namespaced_lease(LEASE, FRACGPU_NAMESPACE).spec.holder_identity
        )

    # a replica leads again once a stolen Lease expires (15 s), ...
    wait_until(lambda: holder() in replicas, "a replica holding the Lease again", timeout_s=45)
    # ... and its controllers run: when a pod goes, its GPU and quota use go with it.
    core = kubernetes.client.CoreV1Api(kube_client)
    victim = next(p for p in core.list_namespaced_pod(namespace).items if p.metadata.annotations)
    core.delete_namespaced_pod(victim.metadata.name, namespace, grace_period_seconds=0)
    try:
        wait_until(settled, "accounting after one more pod went", timeout_s=30)
    except AssertionError as error:
        raise AssertionError(f"{error}: {differences}") from None
