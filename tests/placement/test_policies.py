"""Each policy's choice on small clusters whose right answer can be worked out by hand."""

import pytest

from fracgpu.model import WHOLE_CARD, GPUAllocation, MemoryRequest
from fracgpu.placement import ClusterView, NoFit, Placement, PodDemand, Policy
from tests.placement.helpers import container, node, reserve_cluster, share, uuids


def placed(view: ClusterView, demand: PodDemand, policy: Policy) -> Placement:
    result = view.place(demand, policy)
    assert isinstance(result, Placement), result
    return result


def take(view: ClusterView, node_name: str, uuid: str, cores: int, memory_mib: int = 0) -> None:
    view.allocate(node_name, [GPUAllocation(uuid, cores, memory_mib)])


def test_binpack_fills_the_fullest_node_and_gpu() -> None:
    view = ClusterView([node("a", 2), node("b", 4)])
    assert uuids(placed(view, share(30), Policy.BINPACK)) == ["a-gpu0"]
    take(view, "a", "a-gpu1", 50)
    # a-gpu1 has 50 left: after a 30 share it keeps 20, the least of all GPUs.
    assert uuids(placed(view, share(30), Policy.BINPACK)) == ["a-gpu1"]


def test_spread_picks_the_emptiest_node_and_gpu() -> None:
    view = ClusterView([node("a", 2), node("b", 4)])
    take(view, "b", "b-gpu0", 10)
    result = placed(view, share(30), Policy.SPREAD)
    assert result.node == "b"  # 390 free cores on b against 200 on a
    assert uuids(result) == ["b-gpu1"]  # an untouched GPU, lowest index


def test_best_fit_counts_cpu_and_memory_left() -> None:
    # Same GPUs; b has far less CPU free, so b is the tighter fit.
    view = ClusterView([node("a", 1, cpu_milli=64000), node("b", 1, cpu_milli=8000)])
    assert placed(view, share(50, cpu_milli=4000), Policy.BEST_FIT).node == "b"
    assert placed(view, share(50, cpu_milli=4000), Policy.BINPACK).node == "a"  # ties: first


def test_fragmentation_keeps_room_for_the_usual_shape() -> None:
    """Pods of 50 cores are common. A 40-core pod on the GPU with 60 free would strand 20
    cores no 50-core pod can use (binpack does that); on the free GPU 60 remain usable."""
    view = ClusterView([node("a", 2)])
    for _ in range(10):
        view.observe(share(50))
    take(view, "a", "a-gpu0", 40)
    assert uuids(placed(view, share(40), Policy.BINPACK)) == ["a-gpu0"]
    assert uuids(placed(view, share(40), Policy.FRAGMENTATION)) == ["a-gpu1"]


def test_fragmentation_avoids_stranding_gpus_without_cpu() -> None:
    """Whole-GPU pods with 4 CPUs are the usual shape. Node a has one free GPU and exactly
    4 CPUs: a CPU-only pod there would strand its GPU; on b it strands nothing."""
    view = ClusterView([node("a", 1, cpu_milli=4000), node("b", 1, cpu_milli=64000)])
    whole = PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=4000)
    for _ in range(5):
        view.observe(whole)
    cpu_only = PodDemand((), cpu_milli=2000)
    assert placed(view, cpu_only, Policy.FRAGMENTATION).node == "b"
    assert placed(view, cpu_only, Policy.BEST_FIT).node == "a"


def test_fragmentation_without_observations_still_places() -> None:
    view = ClusterView([node("a", 2)])
    take(view, "a", "a-gpu1", 50)
    # No workload known: it falls back to packing the GPU that is left fullest.
    assert uuids(placed(view, share(30), Policy.FRAGMENTATION)) == ["a-gpu1"]


def test_fragmentation_keeps_whole_nodes_for_multi_gpu_shapes() -> None:
    """With 2-GPU pods common, a 1-GPU pod goes to the node already broken up."""
    view = ClusterView([node("a", 2), node("b", 2)])
    for _ in range(5):
        view.observe(PodDemand((container("main", 100, WHOLE_CARD, gpus=2),)))
    take(view, "b", "b-gpu0", 30)
    result = placed(view, PodDemand((container("main", 100, WHOLE_CARD),)), Policy.FRAGMENTATION)
    assert uuids(result) == ["b-gpu1"]


def test_fragmentation_opens_the_scarce_big_node_last() -> None:
    """Whole-node (8-GPU) pods are common. Only "big" has the CPUs for every 8-GPU shape; s1
    and s2 are the common kind. A one-GPU pod that fits any node alike (same usable capacity
    lost everywhere) must open a common node, not the one kind of node some whole-node pods
    can only run on: without the scarcity cost it ties and goes to the first node, "big".
    No hold: with three, every node of this cluster would be held from the one-GPU pod."""
    big = node("big", 8, cpu_milli=128000, host_memory_mib=786432)
    small = [node(f"s{i}", 8, cpu_milli=96000, host_memory_mib=393216) for i in (1, 2)]
    view = ClusterView([big, *small], held_whole_nodes=0)
    whole_node = PodDemand((container("main", 100, WHOLE_CARD, gpus=8),), cpu_milli=88000)
    one_gpu = PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=12000)
    for _ in range(5):
        view.observe(whole_node)
    for _ in range(20):
        view.observe(one_gpu)
    first = placed(view, one_gpu, Policy.FRAGMENTATION)
    assert first.node == "s1"
    view.allocate(first.node, list(first.containers[0].devices), cpu_milli=12000)
    # s1 is open now: the next one-GPU pod packs there, still leaving "big" whole.
    assert placed(view, one_gpu, Policy.FRAGMENTATION).node == "s1"


@pytest.mark.parametrize("gpus", [0, 1])
def test_fragmentation_takes_the_last_node_of_a_kind_only_when_nothing_else_fits(
    gpus: int,
) -> None:
    """A pod of 90 CPUs on s1 leaves 6 CPUs there and strands 7 or 8 GPUs of the usual
    shape; on "big" it strands none. That loss outweighs the cost of opening the scarce
    node, so without the reserve the pod opens "big", the last node of its kind. With it,
    the pod goes to s1; a pod of 100 CPUs, which only "big" can host, still gets it. (No
    hold: with three, all three untouched nodes would be held from these pods.)"""
    view = reserve_cluster(held_whole_nodes=0)
    containers = (container("main", 100, WHOLE_CARD),) * gpus
    fits_anywhere = PodDemand(containers, cpu_milli=90000)
    assert placed(view, fits_anywhere, Policy.FRAGMENTATION).node == "s1"
    only_big = PodDemand(containers, cpu_milli=100000)
    assert placed(view, only_big, Policy.FRAGMENTATION).node == "big"


def test_fragmentation_keeps_the_last_host_only_while_wide_pods_are_expected() -> None:
    """With s1 and s2 opened, "big" is the one untouched node and covers every untouched
    node's kind, so it is nothing rare. It is kept from a 90-CPU pod without GPUs while the
    workload still expects an 8-GPU pod before the cluster fills (5 in 105 arrivals, 23
    GPUs free: about 1.2 expected); once such pods are rare enough it takes "big" by its
    loss."""
    view = reserve_cluster()
    for name in ("s1", "s2"):
        take(view, name, f"{name}-gpu0", 100)
    gpu_less = PodDemand((), cpu_milli=90000)
    assert placed(view, gpu_less, Policy.FRAGMENTATION).node in ("s1", "s2")
    for _ in range(5000):
        view.observe(PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=4000))
    assert placed(view, gpu_less, Policy.FRAGMENTATION).node == "big"


@pytest.mark.parametrize("policy", list(Policy))
def test_exclusive_needs_a_completely_free_gpu(policy: Policy) -> None:
    view = ClusterView([node("a", 2)])
    take(view, "a", "a-gpu0", 1, 256)  # 99 cores free, but one container is there
    result = placed(view, PodDemand((container("main", 100, WHOLE_CARD),)), policy)
    assert result.containers[0].devices == (GPUAllocation("a-gpu1", 100, 16384),)
    take(view, "a", "a-gpu1", 100, 16384)
    assert isinstance(view.place(PodDemand((container("main", 100, WHOLE_CARD),)), policy), NoFit)


@pytest.mark.parametrize("policy", list(Policy))
def test_multi_gpu_container_gets_distinct_gpus_on_one_node(policy: Policy) -> None:
    view = ClusterView([node("a", 2), node("b", 4)])
    result = placed(view, PodDemand((container("main", 100, WHOLE_CARD, gpus=3),)), policy)
    assert result.node == "b"
    assert len(set(uuids(result))) == 3
    # A share on each of two GPUs (HAMi nvidia.com/gpu: 2 with gpucores 40).
    result = placed(view, share(40, gpus=2), policy)
    assert len(set(uuids(result))) == 2
    assert {u.split("-")[0] for u in uuids(result)} == {result.node}


@pytest.mark.parametrize("policy", list(Policy))
def test_multi_container_pod_lands_on_one_node(policy: Policy) -> None:
    """x (60) fits only on b-gpu1 or a-gpu0; y (50) then fits only on b-gpu0, so the pod goes
    to b, split over its two GPUs; a's single GPU cannot hold 60 + 50."""
    view = ClusterView([node("a", 1), node("b", 2)])
    take(view, "b", "b-gpu0", 50)
    memory = MemoryRequest(mib=1024)
    demand = PodDemand((container("x", 60, memory), container("y", 50, memory)))
    result = placed(view, demand, policy)
    assert result.node == "b"
    assert [(c.container, [a.uuid for a in c.devices]) for c in result.containers] == [
        ("x", ["b-gpu1"]),
        ("y", ["b-gpu0"]),
    ]


@pytest.mark.parametrize("policy", list(Policy))
def test_two_containers_may_share_one_gpu(policy: Policy) -> None:
    view = ClusterView([node("a", 1)])
    memory = MemoryRequest(mib=1024)
    result = placed(
        view, PodDemand((container("x", 60, memory), container("y", 40, memory))), policy
    )
    assert uuids(result) == ["a-gpu0", "a-gpu0"]
    too_big = PodDemand((container("x", 60, memory), container("y", 41, memory)))
    assert isinstance(view.place(too_big, policy), NoFit)
