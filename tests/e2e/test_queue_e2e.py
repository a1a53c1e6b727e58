"""Queue mode against the real control plane (issue 21): kube-apiserver + etcd, the fracgpu
webhook in cluster mode with --placement-mode queue, and the stock kube-scheduler 1.20
binary as the second scheduler calling the webhook's extender. Nodes are API objects with
the canonical resources (no kubelet: binding needs none); pods placed at admission are
bound by the test, as the default scheduler would bind them.

A pod that does not fit waits Pending with fracgpu's reason in kube-scheduler's condition and
event and its place in the queue in fracgpu's own condition; it binds by itself to the right
node, with its assignment, when room frees; the queue keeps priority order, and the head's
node is held against a stream of small pods.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import pytest

from fracgpu import codec, names
from fracgpu.model import Assignment, ContainerAssignment, GPUAllocation
from webhook.admission.mutate import bind_metadata

from .fixtures import NodeFactory
from .harness import ControlPlane, E2EConfig
from .harness.ports import free_port
from .harness.resources import FRACGPU_GROUP, FRACGPU_VERSION, create_gpuquota
from .queue_setup import new_gpu_node, scheduler_running
from .scheduler_harness import install_chart_scheduler_rbac, scheduler_binary
from .webhook_harness import Webhooks, running_webhooks

pytestmark = pytest.mark.e2e
WHOLE = {"tencent.com/vcuda-core": "100", "tencent.com/vcuda-memory": "160"}
WAIT_S = 90.0


def share(cores: int) -> dict[str, str]:
    return {"tencent.com/vcuda-core": str(cores), "tencent.com/vcuda-memory": "16"}


@pytest.fixture(scope="module")
def queue_mode(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    e2e_config: E2EConfig,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Webhooks]:
    binary = scheduler_binary(e2e_config)
    port = free_port()
    work = tmp_path_factory.mktemp("queue")
    args = ["--placement-mode", "queue", "--extender-port", str(port)]
    with running_webhooks(
        kube_client, control_plane.kubeconfig("webhook"), work, args, replicas=1
    ) as running:
        # As the chart runs it: the webhook's identity with the sidecar's RBAC, leader-elected.
        identity = "webhook" if install_chart_scheduler_rbac(kube_client) else "admin"
        with scheduler_running(
            binary, work, control_plane.kubeconfig(identity), port, leader_elect=True
        ):
            yield running


class Pods:
    def __init__(self, client: kubernetes.client.ApiClient, namespace: str) -> None:
        self.client = client
        self.core = kubernetes.client.CoreV1Api(client)
        self.namespace = namespace

    def create(
        self, name: str, limits: dict[str, str], annotations: dict[str, str] | None = None
    ) -> dict[str, Any]:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {
                "containers": [
                    {"name": "main", "image": "cuda:12", "resources": {"limits": limits}}
                ]
            },
        }
        created = self.core.create_namespaced_pod(self.namespace, body)
        return dict(self.client.sanitize_for_serialization(created))

    def get(self, name: str) -> dict[str, Any]:
        found = self.core.read_namespaced_pod(name, self.namespace)
        return dict(self.client.sanitize_for_serialization(found))

    def placed_now(self, name: str) -> dict[str, Any]:
        """Create-time placement (the fast path): bind the pod where fracgpu pinned it, as
        the default scheduler would."""
        pod = self.get(name)
        node = codec.decode_assignment(pod["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT])
        self.core.create_namespaced_pod_binding(
            name,
            self.namespace,
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node.node},
            },
            _preload_content=False,
        )
        return pod

    def delete(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)

    def condition(self, name: str, kind: str) -> str:
        for cond in self.get(name).get("status", {}).get("conditions") or []:
            if cond.get("type") == kind:
                return str(cond.get("message", ""))
        return ""

    def wait_condition(self, name: str, kind: str, text: str) -> None:
        wait_for(lambda: text in self.condition(name, kind), f"{name}: {kind} saying {text!r}")

    def cleanup(self) -> None:
        """Every pod of the namespace gone: the queue is cluster-wide, the next test counts."""
        self.core.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0)

    def events(self, name: str) -> list[tuple[str, str]]:
        found = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return [(e.reason, e.message or "") for e in found.items]


@pytest.fixture
def pods(kube_client: kubernetes.client.ApiClient, namespace: str) -> Iterator[Pods]:
    made = Pods(kube_client, namespace)
    yield made
    made.cleanup()


def wait_for(predicate: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.3)


def full_node(nodes: NodeFactory, pods: Pods, prefix: str, *, gpus: int = 1) -> str:
    """A new node whose every GPU a placed pod ("blocker") holds: the next GPU pod queues."""
    node = new_gpu_node(nodes, prefix, gpus=gpus)
    pods.create("blocker", {resource: str(int(whole) * gpus) for resource, whole in WHOLE.items()})
    pods.placed_now("blocker")
    return node


def queued(pod: dict[str, Any]) -> bool:
    annotations = pod["metadata"].get("annotations") or {}
    return names.ANNOTATION_QUEUED in annotations and names.ANNOTATION_ASSIGNMENT not in annotations


def nodes_devices(client: kubernetes.client.ApiClient, node: str) -> list[str]:
    gpunode = kubernetes.client.CustomObjectsApi(client).get_cluster_custom_object(
        FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", node
    )
    return [d["uuid"] for d in gpunode["status"]["devices"]]


def used(client: kubernetes.client.ApiClient, namespace: str) -> dict[str, int]:
    quota = kubernetes.client.CustomObjectsApi(client).get_namespaced_custom_object(
        FRACGPU_GROUP, FRACGPU_VERSION, namespace, "gpuquotas", "gpu"
    )
    return dict((quota.get("status") or {}).get("used") or {})


def test_a_pod_that_does_not_fit_waits_with_reasons_then_binds_by_itself(
    queue_mode: Webhooks,
    nodes: NodeFactory,
    kube_client: kubernetes.client.ApiClient,
    namespace: str,
    pods: Pods,
) -> None:
    create_gpuquota(kube_client, namespace, {"cores": 200})
    node = full_node(nodes, pods, "qa")
    waiter = pods.create("waiter", share(60))
    assert queued(waiter)
    assert waiter["spec"]["schedulerName"] == names.DEFAULT_SCHEDULER_NAME

    # kube-scheduler's own condition and event carry the extender's reason ...
    wait_for(
        lambda: "fracgpu: waiting for 60 vcuda-core" in pods.condition("waiter", "PodScheduled"),
        "kube-scheduler's PodScheduled condition with fracgpu's reason",
    )
    wait_for(
        lambda: any(
            r == "FailedScheduling" and "1st of 1 in the fracgpu queue" in m
            for r, m in pods.events("waiter")
        ),
        "a FailedScheduling event with fracgpu's reason",
    )
    # ... and fracgpu's says where the pod stands.
    wait_for(
        lambda: "1st of 1 in the fracgpu queue" in pods.condition("waiter", "fracgpu.io/Queued"),
        "fracgpu's Queued condition",
    )
    wait_for(lambda: any(r == "Queued" for r, _ in pods.events("waiter")), "the Queued event")
    # Quota is charged while it waits: the blocker's 100 cores and the waiter's 60.
    wait_for(lambda: used(kube_client, namespace).get("cores") == 160, "quota charged queued")
    assert pods.get("waiter")["spec"].get("nodeName") is None

    pods.delete("blocker")
    bound = wait_for(
        lambda: (p := pods.get("waiter"))["spec"].get("nodeName") and p, "the waiter bound"
    )
    assert bound["spec"]["nodeName"] == node
    assignment = codec.decode_assignment(
        bound["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT]
    )
    assert assignment.node == node
    assert [(a.cores, a.memory_mib) for a in assignment.allocations()] == [(60, 4096)]
    assert bound["metadata"]["labels"][names.LABEL_MANAGED] == "true"
    assert bound["metadata"]["labels"][names.LABEL_ASSIGNED_NODE] == node
    assert (
        assignment.reservation_id
        == bound["metadata"]["annotations"][names.ANNOTATION_RESERVATION_ID]
    )
    wait_for(lambda: used(kube_client, namespace).get("cores") == 60, "quota after the bind")
    pods.wait_condition("waiter", "fracgpu.io/Queued", f"placed on {node}")


def test_the_head_holds_its_node_against_a_stream_of_small_pods(
    queue_mode: Webhooks,
    nodes: NodeFactory,
    kube_client: kubernetes.client.ApiClient,
    namespace: str,
    pods: Pods,
) -> None:
    node = new_gpu_node(nodes, "qb", gpus=1)
    for name in ("small-1", "small-2"):
        pods.create(name, share(40))
        pods.placed_now(name)
    assert queued(pods.create("big", WHOLE))
    wait_for(lambda: "fracgpu" in pods.condition("big", "PodScheduled"), "big tried")
    assert queued(pods.create("small-3", share(30)))
    pods.delete("small-1")  # 60 cores free: small-3 would fit, big not yet
    wait_for(
        lambda: f"held for {namespace}/big" in pods.condition("small-3", "PodScheduled"),
        "small-3 kept off the node the head holds",
    )
    # A new small pod does not take the held room at admission either: it queues.
    assert queued(pods.create("small-4", share(30)))
    assert pods.get("small-3")["spec"].get("nodeName") is None
    pods.delete("small-2")
    wait_for(lambda: pods.get("big")["spec"].get("nodeName") == node, "big bound")
    for name in ("small-3", "small-4"):
        assert pods.get(name)["spec"].get("nodeName") is None, name


def test_granted_priority_goes_first_then_arrival(
    queue_mode: Webhooks,
    nodes: NodeFactory,
    kube_client: kubernetes.client.ApiClient,
    namespace: str,
    pods: Pods,
) -> None:
    create_gpuquota(kube_client, namespace, {"cores": 1000}, grants={"priority": "high"})
    node = full_node(nodes, pods, "qc")
    assert queued(pods.create("early", WHOLE))
    assert queued(pods.create("later", WHOLE))
    assert queued(pods.create("vip", WHOLE, {names.ANNOTATION_PRIORITY: "high"}))
    for name, place in (("vip", "1st"), ("early", "2nd"), ("later", "3rd")):
        pods.wait_condition(name, "fracgpu.io/Queued", f"{place} of 3 in the fracgpu queue")
    pods.delete("blocker")
    wait_for(lambda: pods.get("vip")["spec"].get("nodeName") == node, "vip bound first")
    assert pods.get("early")["spec"].get("nodeName") is None
    pods.delete("vip")
    wait_for(lambda: pods.get("early")["spec"].get("nodeName") == node, "early bound next")
    assert pods.get("later")["spec"].get("nodeName") is None


def test_status_writes_are_bounded_one_event_per_waiting_pod(
    queue_mode: Webhooks,
    nodes: NodeFactory,
    kube_client: kubernetes.client.ApiClient,
    namespace: str,
    pods: Pods,
) -> None:
    """Twelve pods wait through several status rounds (1 s apart here): each gets fracgpu's
    condition and exactly one Queued event, not one per round or per scheduling attempt."""
    full_node(nodes, pods, "qd")
    waiting = [f"w{i:02d}" for i in range(12)]
    for name in waiting:
        assert queued(pods.create(name, share(60)))
    for name in waiting:
        pods.wait_condition(name, "fracgpu.io/Queued", f" of {len(waiting)} in the fracgpu queue")
    time.sleep(5)  # five more rounds
    for name in waiting:
        assert [r for r, _ in pods.events(name)].count("Queued") == 1, name
    (replica,) = queue_mode.replicas
    assert replica.metric("fracgpu_webhook_queue_waiting") == len(waiting)


def test_a_queued_entry_copied_onto_another_pod_never_places_it(
    queue_mode: Webhooks,
    nodes: NodeFactory,
    kube_client: kubernetes.client.ApiClient,
    namespace: str,
    pods: Pods,
) -> None:
    """Within the admission window a tenant can copy a genuine sealed entry (and its
    reservation ID) onto a pod of their own; the copy is charged like any queued pod, and the
    two are never both placed: one reservation ID places one pod."""
    node = full_node(nodes, pods, "qe", gpus=2)
    original = pods.create("original", share(60))
    assert queued(original)
    copied = {
        names.ANNOTATION_QUEUED: original["metadata"]["annotations"][names.ANNOTATION_QUEUED],
        names.ANNOTATION_RESERVATION_ID: original["metadata"]["annotations"][
            names.ANNOTATION_RESERVATION_ID
        ],
    }
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "zcopy", "annotations": copied},
        "spec": {
            "schedulerName": names.DEFAULT_SCHEDULER_NAME,
            "containers": [
                {"name": "main", "image": "cuda:12", "resources": {
                    "limits": {"tencent.com/vcuda-core": "60", "tencent.com/vcuda-memory": "16"},
                    "requests": {"tencent.com/vcuda-core": "60", "tencent.com/vcuda-memory": "16"},
                }}
            ],
        },
    }  # fmt: skip
    # Within the window the copy passes admission (fresh seal) and waits, charged ...
    assert queued(dict(kube_client.sanitize_for_serialization(
        pods.core.create_namespaced_pod(namespace, body))))  # fmt: skip
    pods.delete("blocker")
    # ... but the two pods carrying one reservation ID never both run: whichever kube-scheduler
    # binds first is placed (both are the tenant's, in one namespace: the seal names it), and
    # the other is refused at bind, atomically with the first one's reservation.
    both = ("original", "zcopy")
    bound = wait_for(
        lambda: [n for n in both if pods.get(n)["spec"].get("nodeName")], "one of the two bound"
    )
    assert pods.get(bound[0])["spec"]["nodeName"] == node
    (other,) = set(both) - {bound[0]}
    pods.wait_condition(other, "PodScheduled", "(a copied queued entry)")
    assert [n for n in both if pods.get(n)["spec"].get("nodeName")] == bound


def test_a_pod_placed_by_a_bind_whose_binding_failed_binds_where_it_was_placed(
    queue_mode: Webhooks,
    control_plane: ControlPlane,
    nodes: NodeFactory,
    kube_client: kubernetes.client.ApiClient,
    namespace: str,
    pods: Pods,
) -> None:
    """The extender writes the assignment, then creates the Binding; when the Binding fails
    the pod keeps its assignment, and the next attempt binds it to that node (the filter
    offers that node only)."""
    busy = full_node(nodes, pods, "qf-0")
    assert (
        codec.decode_assignment(
            pods.get("blocker")["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT]
        ).node
        == busy
    )
    waiter = pods.create("waiter", share(60))
    assert queued(waiter)
    # What the extender's bind writes before its Binding, written here by fracgpu's account
    # on the busy node's GPU (a bind whose Binding then failed): the pod must go there.
    gpu = nodes_devices(kube_client, busy)[0]
    rid = waiter["metadata"]["annotations"][names.ANNOTATION_RESERVATION_ID]
    assignment = Assignment(
        busy, rid, (ContainerAssignment("main", (GPUAllocation(gpu, 60, 4096),)),)
    )
    webhook_core = kubernetes.client.CoreV1Api(control_plane.api_client("webhook"))
    webhook_core.patch_namespaced_pod("waiter", namespace, {"metadata": bind_metadata(assignment)})
    # A node with room: placing the pod afresh would choose it (and the bind would refuse).
    new_gpu_node(nodes, "qf-1", gpus=1)
    bound = wait_for(
        lambda: (p := pods.get("waiter"))["spec"].get("nodeName") and p, "the waiter bound"
    )
    assert bound["spec"]["nodeName"] == busy
