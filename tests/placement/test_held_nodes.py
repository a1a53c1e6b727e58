"""The last untouched nodes the expected multi-GPU pods need are held from narrower pods.

``reserve_cluster``: "big" (128 CPUs), "s1" and "s2" (96 CPUs) all host the 8-GPU pods
of 88 CPUs that 5 of the 105 observed pods are. Filling s1 and s2
leaves "big" as the last untouched node, kept for those pods (``kept_for_demand``).
"""

import pytest

from fracgpu.model import WHOLE_CARD, GPUAllocation
from fracgpu.placement import (
    ClusterView,
    Constraints,
    NoFit,
    NoFitReason,
    Placement,
    PodDemand,
    Policy,
)
from fracgpu.placement.view import MAX_HELD_WHOLE_NODES
from tests.placement.helpers import container, node, reserve_cluster

ONE_GPU = PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=4000)
EIGHT_GPUS = PodDemand((container("main", 100, WHOLE_CARD, gpus=8),), cpu_milli=88000)


def fill(view: ClusterView, *names: str) -> None:
    """Every GPU and CPU of these nodes taken."""
    for name in names:
        cpu, _ = view.node_free(name)
        view.allocate(name, [GPUAllocation(f"{name}-gpu{i}", 100, 0) for i in range(8)], cpu)


def wide_pods_expected(view: ClusterView) -> ClusterView:
    for _ in range(5):
        view.observe(EIGHT_GPUS)
    for _ in range(100):
        view.observe(ONE_GPU)
    return view


def test_a_narrow_pod_that_fits_only_on_the_last_host_waits_and_says_why() -> None:
    view = reserve_cluster()
    fill(view, "s1", "s2")
    assert view.held_from(ONE_GPU, Policy.FRAGMENTATION) == {"big"}
    refused = view.place(ONE_GPU, Policy.FRAGMENTATION)
    assert isinstance(refused, NoFit)
    assert refused.reason is NoFitReason.NOT_NOW  # it waits in queue mode
    for words in ("last 1 untouched node", "8 or more GPUs", "held_whole_nodes is 3"):
        assert words in refused.message
    # The pods it is held for still take it, and a pod without GPUs may not drain its CPU.
    assert view.held_from(EIGHT_GPUS, Policy.FRAGMENTATION) == frozenset()
    wide = view.place(EIGHT_GPUS, Policy.FRAGMENTATION)
    assert isinstance(wide, Placement) and wide.node == "big"
    gpu_less = PodDemand((), cpu_milli=4000)
    assert view.held_from(gpu_less, Policy.FRAGMENTATION) == {"big"}
    assert isinstance(view.place(gpu_less, Policy.FRAGMENTATION), NoFit)


def test_other_policies_and_held_whole_nodes_0_place_there() -> None:
    for policy in (Policy.BEST_FIT, Policy.BINPACK, Policy.FGD):
        view = reserve_cluster()
        fill(view, "s1", "s2")
        result = view.place(ONE_GPU, policy)
        assert isinstance(result, Placement) and result.node == "big", policy
    view = wide_pods_expected(
        ClusterView(
            [
                node("big", 8, cpu_milli=128000, host_memory_mib=786432),
                *(node(f"s{i}", 8, cpu_milli=96000, host_memory_mib=393216) for i in (1, 2)),
            ],
            held_whole_nodes=0,
        )
    )
    fill(view, "s1", "s2")
    assert view.held_from(ONE_GPU, Policy.FRAGMENTATION) == frozenset()
    result = view.place(ONE_GPU, Policy.FRAGMENTATION)
    assert isinstance(result, Placement) and result.node == "big"


def test_the_hold_lifts_once_wide_pods_stop_arriving() -> None:
    view = reserve_cluster()
    fill(view, "s1", "s2")
    assert isinstance(view.place(ONE_GPU, Policy.FRAGMENTATION), NoFit)
    for _ in range(5000):
        view.observe(ONE_GPU)
    assert view.held_from(ONE_GPU, Policy.FRAGMENTATION) == frozenset()
    result = view.place(ONE_GPU, Policy.FRAGMENTATION)
    assert isinstance(result, Placement) and result.node == "big"


def test_a_flood_of_wide_pods_holds_no_more_nodes_than_the_setting() -> None:
    """The attack: a tenant creates wide pods (each arrival teaches the workload, even when
    refused) to hold nodes from everyone else. Whatever the flood, the hold covers at most
    ``held_whole_nodes`` nodes; with more untouched hosts left, none is held."""
    hosts = [node(f"big{i}", 8, cpu_milli=128000, host_memory_mib=786432) for i in range(3)]
    busy = node("s1", 8, cpu_milli=96000, host_memory_mib=393216)
    for held, expected in ((2, frozenset()), (3, frozenset({"big0", "big1", "big2"}))):
        view = ClusterView([*hosts, busy], held_whole_nodes=held)
        for _ in range(10000):
            view.observe(EIGHT_GPUS)
        view.observe(ONE_GPU)
        fill(view, "s1")
        assert view.held_from(ONE_GPU, Policy.FRAGMENTATION) == expected, held
        result = view.place(ONE_GPU, Policy.FRAGMENTATION)
        assert isinstance(result, NoFit) == bool(expected), held


@pytest.mark.parametrize("value", [-1, MAX_HELD_WHOLE_NODES + 1])
def test_held_whole_nodes_out_of_range_is_refused_with_the_range(value: int) -> None:
    with pytest.raises(
        ValueError, match=f"held_whole_nodes={value}: use a whole number from 0 .hold none. to 64"
    ):
        ClusterView([node("a", 1)], held_whole_nodes=value)


def test_a_node_that_is_not_held_is_taken_before_the_pod_is_refused() -> None:
    """ "odd" (V100s, 64 CPUs) is the last of its kind, so the policy ranks it after the kept
    "big1" and "big2" (``reserved``); but it is not held, and the 1-GPU pod goes there
    rather than being refused for lack of room."""
    nodes = [
        node("big1", 8, cpu_milli=128000, host_memory_mib=786432),
        node("big2", 8, cpu_milli=128000, host_memory_mib=786432),
        node("odd", 8, model="Tesla V100", cpu_milli=64000, host_memory_mib=393216),
        node("s1", 8, cpu_milli=96000, host_memory_mib=393216),
    ]
    view = wide_pods_expected(ClusterView(nodes))
    fill(view, "s1")
    assert view.held_from(ONE_GPU, Policy.FRAGMENTATION) == {"big1", "big2"}
    result = view.place(ONE_GPU, Policy.FRAGMENTATION)
    assert isinstance(result, Placement) and result.node == "odd"
    # Only held nodes left: refused, marked so.
    off = PodDemand(
        ONE_GPU.containers,
        cpu_milli=4000,
        constraints=Constraints(nodes=frozenset({"big1", "big2", "s1"})),
    )
    refused = view.place(off, Policy.FRAGMENTATION)
    assert isinstance(refused, NoFit) and refused.held
    assert "last 2 untouched node(s)" in refused.message


def test_a_pod_as_wide_in_all_as_the_kept_ones_is_not_held() -> None:
    """Two containers of 4 GPUs take a whole node like the 8-GPU pods it is kept for."""
    view = reserve_cluster()
    fill(view, "s1", "s2")
    two_by_four = PodDemand(
        (container("a", 100, WHOLE_CARD, gpus=4), container("b", 100, WHOLE_CARD, gpus=4)),
        cpu_milli=88000,
    )
    assert view.held_from(two_by_four, Policy.FRAGMENTATION) == frozenset()
    result = view.place(two_by_four, Policy.FRAGMENTATION)
    assert isinstance(result, Placement) and result.node == "big"


def test_only_a_refusal_for_held_nodes_is_marked_held() -> None:
    view = reserve_cluster()
    fill(view, "s1", "s2", "big")
    refused = view.place(ONE_GPU, Policy.FRAGMENTATION)
    assert isinstance(refused, NoFit) and refused.reason is NoFitReason.NOT_NOW
    assert not refused.held


def test_the_last_hosts_of_one_wide_shape_are_held_whatever_other_shapes_have() -> None:
    """Four untouched nodes of 2 GPUs are kept for the 2-GPU pods, and "big1" and "big2"
    are the last hosts of the 8-GPU pods: counted per shape, those two are held from a
    1-GPU pod of 12 CPUs (it fits nowhere else); the small nodes' count does not hide it.
    A 2-GPU pod is held off them too (they are kept for wider pods than it)."""
    nodes = [
        node("big1", 8, cpu_milli=128000, host_memory_mib=786432),
        node("big2", 8, cpu_milli=128000, host_memory_mib=786432),
        node("s1", 8, cpu_milli=96000, host_memory_mib=393216),
        *(node(f"t{i}", 2, cpu_milli=8000, host_memory_mib=65536) for i in range(4)),
    ]
    view = ClusterView(nodes)
    for _ in range(5):
        view.observe(EIGHT_GPUS)
    two_gpus = PodDemand((container("main", 100, WHOLE_CARD, gpus=2),), cpu_milli=4000)
    for _ in range(20):
        view.observe(two_gpus)
    one_gpu = PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=12000)
    for _ in range(100):
        view.observe(one_gpu)
    fill(view, "s1")
    assert view.held_from(one_gpu, Policy.FRAGMENTATION) == {"big1", "big2"}
    refused = view.place(one_gpu, Policy.FRAGMENTATION)
    assert isinstance(refused, NoFit) and refused.held
    assert "8 or more GPUs" in refused.message
    assert view.held_from(two_gpus, Policy.FRAGMENTATION) == {"big1", "big2"}
    assert view.held_from(EIGHT_GPUS, Policy.FRAGMENTATION) == frozenset()
