"""The fragmentation index recounts changed nodes lazily, in one pass: its sums must equal an
index built from scratch over the same state."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fracgpu.model import GPUAllocation
from fracgpu.placement.candidates import CandidateFinder
from fracgpu.placement.fragmentation import WHOLE_NODE_PENALTY, FragmentationIndex
from fracgpu.placement.state import ClusterState
from fracgpu.placement.workload import WorkloadModel, shape_of
from tests.placement.helpers import node, share

SHAPES = [share(10, 1024), share(50, 8192, cpu_milli=4000), share(100, 0, gpus=2)]


def counted(nodes: int) -> tuple[ClusterState, FragmentationIndex]:
    state = ClusterState(100)
    for i in range(nodes):
        # Nodes 0 GPUs to 3: a node without GPUs has empty sums.
        state.add_node(node(f"n{i}", i % 4, cpu_milli=16000), split_count=4)
    workload = WorkloadModel()
    for demand in SHAPES:
        shape = shape_of(demand)
        assert shape is not None
        workload.observe(shape)
    index = FragmentationIndex()
    index.set_workload(workload.typical(), state)
    return state, index


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 9),
    st.lists(
        st.tuples(
            st.integers(0, 8), st.integers(0, 3), st.sampled_from((5, 40, 100)), st.booleans()
        ),
        max_size=30,
    ),
    st.lists(st.booleans(), min_size=30, max_size=30),
)
def test_lazy_recount_equals_a_fresh_index(
    nodes: int, uses: list[tuple[int, int, int, bool]], reads: list[bool]
) -> None:
    state, index = counted(nodes)
    for (n, gpu, cores, with_cpu), read in zip(uses, reads, strict=False):
        if n >= nodes or gpu >= n % 4:
            continue
        row = state.apply(
            f"n{n}", [GPUAllocation(f"n{n}-gpu{gpu}", cores, 512)], 2000 if with_cpu else 0, 0, 1
        )
        assert row is not None
        index.update_node(state, row)
        if read:  # a score read now recounts what changed so far
            index._refresh(state)
    index._refresh(state)
    fresh = FragmentationIndex()
    fresh.shapes = index.shapes
    fresh.rebuild(state)
    for name in ("usable_now", "pods_now", "usable", "pods", "effective_now"):
        assert np.array_equal(getattr(index, name), getattr(fresh, name)), name


def test_opening_an_untouched_node_costs_by_the_multi_gpu_frequency() -> None:
    """A one-GPU share scored on every GPU: candidates on untouched nodes lose
    WHOLE_NODE_PENALTY x (frequency of multi-GPU shapes) GPUs more than without the
    penalty; those on a node already in use lose the same."""
    state, index = counted(8)
    state.apply("n1", [GPUAllocation("n1-gpu0", 10, 0)], 0, 0, sign=1)  # n1 is in use
    plain = FragmentationIndex(whole_node_penalty=0.0)
    plain.shapes, plain.weights = index.shapes, index.weights
    plain.rebuild(state)
    index.rebuild(state)
    finder = CandidateFinder(state)
    demand = share(10, 1024)
    cands = finder.find(demand)
    extra = index.loss(state, cands, 0, 0) - plain.loss(state, cands, 0, 0)
    wide = float(index.weights[index.s_gpus > 1].sum())
    assert wide > 0
    used = np.array([state.node_names[r] == "n1" for r in cands.rows])
    assert np.allclose(extra[used], 0.0)
    assert np.allclose(extra[~used], WHOLE_NODE_PENALTY * wide * state.gpu_units)


def test_a_new_typical_set_on_the_same_nodes_equals_a_fresh_index() -> None:
    """When the typical shapes change (one leaves, one comes, the order changes) the kept
    shapes' columns are moved and only the new one is counted: the result is what a rebuild
    from scratch gives, and later changes are still counted."""
    state, index = counted(9)
    state.apply("n1", [GPUAllocation("n1-gpu0", 40, 512)], 2000, 0, sign=1)
    index.update_node(state, state.row("n1"))  # left stale on purpose
    version = index.version
    shapes = [shape_of(d) for d in (share(100, 0, gpus=2), share(30, 0), SHAPES[0])]
    typical = [(s, 1 / 3) for s in shapes if s is not None]
    index.set_workload(typical, state)
    assert index.version > version
    state.apply("n2", [GPUAllocation("n2-gpu1", 100, 0)], 0, 0, sign=1)
    index.update_node(state, state.row("n2"))
    index._refresh(state)
    fresh = FragmentationIndex()
    fresh.set_workload(typical, state)
    for name in ("usable_now", "pods_now", "usable", "pods", "effective_now", "elig", "s_cpu"):
        assert np.array_equal(getattr(index, name), getattr(fresh, name)), name
