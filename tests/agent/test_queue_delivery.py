"""Queue mode at the device plugin, over real gRPC with the test kubelet: a queued pod's
GPUs reach its containers in the Allocate response, and PreStartContainer refuses a
container that was not the one served (tenants racing pods of one size, many containers,
an env that would replace the GPUs)."""

from dataclasses import replace

import grpc
import pytest

from agent.deviceplugin.units import ResourceKind
from agent.hostfiles import allocation_key
from agent.nodepods import NodePod, NodePodsError, PodContainer
from agent.podlookup import PodInfo
from agent.queuedelivery import QueueDelivery, Served
from fracgpu.codec import encode_assignment
from fracgpu.model import Assignment, ContainerAssignment, GPUAllocation
from fracgpu.names import ENV_VISIBLE_DEVICES, RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY
from tests.agent.conftest import GPU_A, GPU_B, NODE, AgentRig, assigned_pod
from tests.agent.kubelet import ContainerRef

CORE = RESOURCE_VCUDA_CORE
MEM = RESOURCE_VCUDA_MEMORY
NS = "team-a"


def queued(
    name: str,
    containers: dict[str, list[GPUAllocation]],
    *,
    scheduled_at: str = "2026-11-27T10:00:00Z",
    node: str = NODE,
    override: str = "",
) -> tuple[PodInfo, NodePod]:
    assignment = Assignment(
        node=node,
        reservation_id=f"r-{name}",
        containers=tuple(ContainerAssignment(c, tuple(d)) for c, d in containers.items()),
    )
    encoded = encode_assignment(assignment)
    info = PodInfo(
        NS, name, f"uid-{name}", node, encoded, queued=True, region_containers=frozenset(containers)
    )
    on_node = NodePod(
        namespace=NS,
        name=name,
        uid=f"uid-{name}",
        queued=True,
        assignment=encoded,
        phase="Pending",
        deleting=False,
        scheduled_at=scheduled_at,
        created_at=scheduled_at,
        containers=tuple(PodContainer(c, override, started=False) for c in containers),
    )
    return info, on_node


def add_queued(rig: AgentRig, *args: object, **kwargs: object) -> PodInfo:
    info, on_node = queued(*args, **kwargs)  # type: ignore[arg-type]
    rig.pods.add(info, on_node)
    return info


def add_two_of_one_size(rig: AgentRig) -> None:
    """Queued q1 on GPU A and q2 on GPU B, one size, q2 bound a second later: the pair
    whose allocations only the agent's guess tells apart."""
    add_queued(rig, "q1", {"main": [GPUAllocation(GPU_A.uuid, 50, 4096)]})
    add_queued(
        rig,
        "q2",
        {"main": [GPUAllocation(GPU_B.uuid, 50, 4096)]},
        scheduled_at="2026-11-27T10:00:01Z",
    )


def env_of(rig: AgentRig, ref: ContainerRef, resource: str, count: int) -> dict[str, str]:
    _, reply = rig.kubelet.allocate(ref, resource, count)
    return dict(reply.envs)


def allocate(rig: AgentRig, ref: ContainerRef, cores: int, blocks: int) -> dict[str, str]:
    """Both resources, as kubelet allocates a container; their envs must agree."""
    core_env = env_of(rig, ref, CORE, cores)
    assert env_of(rig, ref, MEM, blocks) == core_env
    return core_env


def start(rig: AgentRig, ref: ContainerRef) -> None:
    for resource in (CORE, MEM):
        rig.kubelet.pre_start(ref, resource)


def limits_gpu(rig: AgentRig, ref: ContainerRef, resource: str) -> str:
    key = allocation_key(resource, rig.kubelet.allocations[(ref, resource)])
    fields = dict(line.split("=", 1) for line in rig.files.limits_path(key).read_text().split())
    return fields["device.0.uuid"]


def test_a_queued_pod_gets_its_assigned_gpu_in_the_allocate_env(rig: AgentRig) -> None:
    add_queued(rig, "q", {"main": [GPUAllocation(GPU_B.uuid, 30, 4096)]})
    rig.kubelet.admit(NS, "q", ["main"])
    ref = ContainerRef(NS, "q", "main")
    assert allocate(rig, ref, 30, 16) == {ENV_VISIBLE_DEVICES: GPU_B.uuid}
    start(rig, ref)
    assert limits_gpu(rig, ref, CORE) == limits_gpu(rig, ref, MEM) == GPU_B.uuid


def test_an_immediate_pod_gets_no_env_and_starts_as_before(rig: AgentRig) -> None:
    # A queued pod bound to the node but not yet taken in by kubelet is not the one admitted.
    add_queued(rig, "later", {"main": [GPUAllocation(GPU_A.uuid, 30, 4096)]})
    rig.pods.add(assigned_pod("now", {"main": [GPUAllocation(GPU_B.uuid, 30, 4096)]}))
    rig.kubelet.admit(NS, "now", ["main"])
    ref = ContainerRef(NS, "now", "main")
    assert allocate(rig, ref, 30, 16) == {}
    start(rig, ref)
    assert limits_gpu(rig, ref, CORE) == GPU_B.uuid


def test_the_api_cache_is_read_and_etcd_only_when_the_cache_lags(rig: AgentRig) -> None:
    add_queued(rig, "q1", {"main": [GPUAllocation(GPU_A.uuid, 30, 4096)]})
    rig.kubelet.admit(NS, "q1", ["main"])
    assert env_of(rig, ContainerRef(NS, "q1", "main"), CORE, 30) == {
        ENV_VISIBLE_DEVICES: GPU_A.uuid
    }
    assert rig.pods.lists == [False]  # one list, from the cache
    # The cache has not seen q2 bound yet, but kubelet is admitting it: read from etcd.
    rig.pods.stale_node_pods = dict(rig.pods.node_pods)
    add_queued(rig, "q2", {"main": [GPUAllocation(GPU_B.uuid, 30, 4096)]})
    rig.kubelet.admit(NS, "q2", ["main"])
    assert env_of(rig, ContainerRef(NS, "q2", "main"), CORE, 30) == {
        ENV_VISIBLE_DEVICES: GPU_B.uuid
    }
    assert rig.pods.lists == [False, False, True]


def test_two_queued_pods_of_one_size_each_get_their_own_gpu(rig: AgentRig) -> None:
    add_two_of_one_size(rig)
    for name, gpu in (("q1", GPU_A), ("q2", GPU_B)):
        rig.kubelet.admit(NS, name, ["main"])  # one at a time, as kubelet admits
        ref = ContainerRef(NS, name, "main")
        assert allocate(rig, ref, 50, 16) == {ENV_VISIBLE_DEVICES: gpu.uuid}
        start(rig, ref)
        assert limits_gpu(rig, ref, CORE) == gpu.uuid


def test_a_pod_kubelet_refused_does_not_take_the_next_pods_gpu(rig: AgentRig) -> None:
    # kubelet took in and refused q1 (its Failed status not yet in the API), then admits
    # q2, bound after it: q2 is served, not the stale q1 (a tenant's refused pod cannot
    # take an innocent pod's allocation).
    add_two_of_one_size(rig)
    rig.kubelet.admit(NS, "q1", ["main"])
    rig.kubelet.admit(NS, "q2", ["main"])
    ref = ContainerRef(NS, "q2", "main")
    assert allocate(rig, ref, 50, 16) == {ENV_VISIBLE_DEVICES: GPU_B.uuid}
    start(rig, ref)
    assert limits_gpu(rig, ref, CORE) == GPU_B.uuid


def test_a_wrong_guess_is_refused_at_start_not_run_on_the_other_pods_gpu(rig: AgentRig) -> None:
    # Should the guess ever be wrong (here kubelet allocates for q1 while q2, bound later,
    # is listed and unserved, which kubelet's one-at-a-time admission does not do), the
    # start is refused: q1 must not start on q2's GPU B.
    add_two_of_one_size(rig)
    rig.kubelet.admit(NS, "q1", ["main"])
    rig.kubelet.admit(NS, "q2", ["main"])
    ref = ContainerRef(NS, "q1", "main")
    assert allocate(rig, ref, 50, 16) == {ENV_VISIBLE_DEVICES: GPU_B.uuid}
    with pytest.raises(grpc.RpcError) as refused:
        start(rig, ref)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"pod {NS}/q2 container main" in str(refused.value.details())
    assert "refusing to start it on a GPU chosen for another container" in str(
        refused.value.details()
    )
    key = allocation_key(CORE, rig.kubelet.allocations[(ref, CORE)])
    assert not rig.files.limits_path(key).exists()


def test_every_container_of_a_many_container_pod_gets_its_own_gpus(rig: AgentRig) -> None:
    gpus = {f"c{i}": GPU_A if i % 2 else GPU_B for i in range(6)}
    add_queued(rig, "many", {c: [GPUAllocation(g.uuid, 10, 1024)] for c, g in gpus.items()})
    rig.kubelet.admit(NS, "many", list(gpus))
    for container, gpu in gpus.items():  # kubelet allocates containers in order
        ref = ContainerRef(NS, "many", container)
        assert allocate(rig, ref, 10, 4) == {ENV_VISIBLE_DEVICES: gpu.uuid}
    for container, gpu in gpus.items():
        ref = ContainerRef(NS, "many", container)
        start(rig, ref)
        assert limits_gpu(rig, ref, MEM) == gpu.uuid
    # Every container served once: a further allocation of that size serves nobody.
    assert env_of(rig, ContainerRef(NS, "other", "main"), CORE, 10) == {}


def test_a_container_whose_env_could_replace_its_gpus_is_refused_at_allocate(
    rig: AgentRig,
) -> None:
    reason = "envFrom[0] has no prefix, so a ConfigMap or Secret key could set it"
    add_queued(rig, "sneaky", {"main": [GPUAllocation(GPU_A.uuid, 30, 4096)]}, override=reason)
    rig.kubelet.admit(NS, "sneaky", ["main"])
    with pytest.raises(grpc.RpcError) as refused:
        rig.kubelet.allocate(ContainerRef(NS, "sneaky", "main"), CORE, 30)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason in str(refused.value.details())
    assert "its own NVIDIA_VISIBLE_DEVICES would replace them" in str(refused.value.details())


def test_a_queued_pod_allocated_without_its_gpus_is_refused_at_start(
    rig: AgentRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node's pods could not be listed at Allocate (API down): nothing was served, so
    # the container would see whatever its image says. Its start is refused instead.
    def unreachable(node_name: str, *, fresh: bool = False) -> list[NodePod]:
        raise NodePodsError("cannot list the pods of node gpu-node-1: the API did not answer")

    info = add_queued(rig, "q", {"main": [GPUAllocation(GPU_A.uuid, 30, 4096)]})
    rig.kubelet.admit(NS, "q", ["main"])
    ref = ContainerRef(NS, "q", "main")
    with monkeypatch.context() as patch:
        patch.setattr(rig.pods, "on_node", unreachable)
        assert allocate(rig, ref, 30, 16) == {}
    with pytest.raises(grpc.RpcError) as refused:
        start(rig, ref)
    assert f"pod {NS}/{info.name} container main is a queued pod" in str(refused.value.details())
    assert "did not serve it its GPUs" in str(refused.value.details())


def test_an_immediate_pod_holding_ids_served_to_a_queued_pod_is_refused(rig: AgentRig) -> None:
    add_queued(rig, "q", {"main": [GPUAllocation(GPU_A.uuid, 30, 4096)]})
    rig.pods.add(assigned_pod("now", {"main": [GPUAllocation(GPU_A.uuid, 30, 4096)]}))
    rig.kubelet.admit(NS, "q", ["main"])  # listed, so it is taken for the one admitted
    ref = ContainerRef(NS, "now", "main")
    assert allocate(rig, ref, 30, 16) == {ENV_VISIBLE_DEVICES: GPU_A.uuid}
    with pytest.raises(grpc.RpcError) as refused:
        start(rig, ref)
    assert f"served to queued pod {NS}/q container main" in str(refused.value.details())


def test_a_served_record_outlives_the_agent_and_is_checked_against_the_assignment(
    rig: AgentRig,
) -> None:
    info = add_queued(rig, "q", {"main": [GPUAllocation(GPU_A.uuid, 30, 4096)]})
    rig.kubelet.admit(NS, "q", ["main"])
    ref = ContainerRef(NS, "q", "main")
    allocate(rig, ref, 30, 16)
    key = allocation_key(CORE, rig.kubelet.allocations[(ref, CORE)])
    record = Served.decode(rig.files.read_served(key) or b"")
    assert record == Served(CORE, NS, "q", "uid-q", "main", GPU_A.uuid)
    # A restarted agent (nothing in memory) reads it: the container is not served twice,
    # even where pod-resources does not show what it holds (1.20 lists no init containers).
    restarted = QueueDelivery(
        node_name=NODE,
        pods=rig.pods,
        known_pods=lambda: {(NS, "q"): {"main": frozenset()}},
        files=rig.files,
    )
    assert restarted.allocate_env(CORE, ResourceKind.COMPUTE, "another-key", ["x"] * 30) == {}
    # The assignment changed after Allocate (written past the webhook): the start is refused.
    moved, _ = queued("q", {"main": [GPUAllocation(GPU_B.uuid, 30, 4096)]})
    rig.pods.add(replace(moved, uid=info.uid))
    with pytest.raises(grpc.RpcError) as refused:
        start(rig, ref)
    assert f"was served GPUs {GPU_A.uuid} but its assignment now names {GPU_B.uuid}" in (
        str(refused.value.details())
    )
