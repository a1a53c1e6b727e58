"""ClusterView bookkeeping: nodes coming and going, units, bad input."""

import pytest

from fracgpu.model import WHOLE_CARD, ContainerRequest, GPUAllocation, MemoryRequest
from fracgpu.placement import ClusterView, NoFit, Placement, PodDemand, Policy
from tests.placement.helpers import container, node, share, uuids


def test_add_and_remove_nodes() -> None:
    view = ClusterView([node("a", 1)])
    view.add_node(node("b", 2))
    assert [n.name for n in view.nodes()] == ["a", "b"]
    with pytest.raises(ValueError, match="already in the view"):
        view.add_node(node("a", 1))
    view.remove_node("a")
    view.remove_node("missing")  # ignored
    result = view.place(share(10), Policy.BINPACK)
    assert isinstance(result, Placement) and result.node == "b"
    view.add_node(node("a", 1))
    assert {n.name for n in view.nodes()} == {"a", "b"}


def test_many_removals_compact_and_keep_free_capacity() -> None:
    view = ClusterView([node("keep", 2)])
    view.allocate("keep", [GPUAllocation("keep-gpu0", 70, 4096)], cpu_milli=1000)
    for i in range(60):
        view.add_node(node(f"tmp{i}", 1))
        view.remove_node(f"tmp{i}")
    assert [n.name for n in view.nodes()] == ["keep"]
    assert view.gpu_free("keep", "keep-gpu0") == (30, 16384 - 4096, 1)
    assert view.node_free("keep") == (31000, 131072)
    # The moved state still places and scores correctly.
    for _ in range(4):
        view.observe(share(50))
    assert uuids(view.place(share(30), Policy.BINPACK)) == ["keep-gpu0"]  # type: ignore[arg-type]
    assert uuids(view.place(share(30), Policy.FRAGMENTATION)) == ["keep-gpu0"]  # type: ignore[arg-type]


def test_allocations_on_unknown_nodes_and_gpus_are_ignored() -> None:
    view = ClusterView([node("a", 1)])
    view.allocate("ghost", [GPUAllocation("x", 50, 1)], 1000, 1000)
    view.allocate("a", [GPUAllocation("other", 50, 1)], 1000, 0)
    assert view.gpu_free("a", "a-gpu0") == (100, 16384, 0)
    assert view.node_free("a") == (31000, 131072)


def test_thousandths_units_keep_trace_precision() -> None:
    view = ClusterView([node("a", 1)], gpu_units=1000, default_split_count=1000)
    view.allocate("a", [GPUAllocation("a-gpu0", 995, 0)])
    fits = PodDemand((ContainerRequest("main", 1, 5, MemoryRequest(mib=0)),))
    too_big = PodDemand((ContainerRequest("main", 1, 6, MemoryRequest(mib=0)),))
    assert isinstance(view.place(fits), Placement)
    assert isinstance(view.place(too_big), NoFit)
    whole = PodDemand((ContainerRequest("main", 1, 1000, MemoryRequest(mib=0)),))
    assert isinstance(view.place(whole), NoFit)


def test_gpu_less_pod_takes_only_cpu_and_memory() -> None:
    view = ClusterView([node("a", 1, cpu_milli=2000), node("b", 1, cpu_milli=8000)])
    result = view.place(PodDemand((), cpu_milli=4000), Policy.BINPACK)
    assert result == Placement("b", ())


@pytest.mark.parametrize(
    ("demand", "message"),
    [
        (PodDemand((container("x", 10, WHOLE_CARD), container("x", 10, WHOLE_CARD))), "unique"),
        (PodDemand((ContainerRequest("x", 0, 10, WHOLE_CARD),)), "gpus=0"),
        (PodDemand((ContainerRequest("x", 1, 101, WHOLE_CARD),)), "cores=101, use 0..100"),
        (PodDemand((ContainerRequest("x", 1, 10, MemoryRequest(mib=-1)),)), "-1 MiB"),
        (PodDemand((), cpu_milli=-5), "cpu_milli=-5"),
    ],
)
def test_bad_demands_are_rejected_clearly(demand: PodDemand, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterView([node("a", 1)]).place(demand)


def test_bad_view_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="default_split_count=0"):
        ClusterView(default_split_count=0)
    with pytest.raises(ValueError, match="gpu_units=0"):
        ClusterView(gpu_units=0)


def test_set_usage_recounts_one_node_like_a_fresh_view() -> None:
    nodes = [node("a", 2), node("b", 2)]
    before = [
        ([GPUAllocation("a-gpu0", 70, 4096)], 1000, 2048),
        ([GPUAllocation("a-gpu1", 20, 1024)], 500, 0),
    ]
    after = [([GPUAllocation("a-gpu1", 50, 8192)], 3000, 4096)]
    recounted = ClusterView(nodes)
    fresh = ClusterView(nodes)
    for view in (recounted, fresh):
        view.allocate("b", [GPUAllocation("b-gpu0", 40, 1024)], 1000, 0)
        for _ in range(8):
            view.observe(share(30))
            view.observe(share(100, gpus=1))
    for allocs, cpu, memory in before:
        recounted.allocate("a", allocs, cpu, memory)
    recounted.set_usage("a", after)
    for allocs, cpu, memory in after:
        fresh.allocate("a", allocs, cpu, memory)
    for name, count in (("a", 2), ("b", 2)):
        assert recounted.node_free(name) == fresh.node_free(name)
        for i in range(count):
            assert recounted.gpu_free(name, f"{name}-gpu{i}") == fresh.gpu_free(
                name, f"{name}-gpu{i}"
            )
    assert recounted.gpu_free("a", "a-gpu0") == (100, 16384, 0)
    for demand in (share(30), share(60), share(100), share(10, cpu_milli=29000)):
        for policy in Policy:
            assert recounted.place(demand, policy) == fresh.place(demand, policy)
    recounted.set_usage("ghost", after)  # unknown nodes are ignored, as in allocate
