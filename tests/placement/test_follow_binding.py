"""The fragmentation index counts GPUs stranded for lack of CPU only while CPU is not the
cluster's scarcer resource by more than ``CPU_BINDS_MARGIN``; past that it scores by FGD's
"one pod fits", exactly as an index built that way would.

``two_nodes``: two nodes of 4 GPUs and 16 CPUs; the usual pod takes one whole GPU and 6 CPUs,
so a node's 16 CPUs feed only two of its four GPUs and stranding changes what a node is worth.
"""

import numpy as np

from fracgpu.model import WHOLE_CARD, GPUAllocation
from fracgpu.placement import PodDemand
from fracgpu.placement.candidates import CandidateFinder
from fracgpu.placement.fragmentation import CPU_BINDS_MARGIN, FragmentationIndex
from fracgpu.placement.state import ClusterState
from fracgpu.placement.workload import Shape, shape_of
from tests.placement.helpers import container, node

USUAL = PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=6000)


def two_nodes() -> tuple[ClusterState, list[tuple[Shape, float]]]:
    state = ClusterState(100)
    for name in ("a", "b"):
        state.add_node(node(name, 4, cpu_milli=16000), split_count=4)
    shape = shape_of(USUAL)
    assert shape is not None
    return state, [(shape, 1.0)]


def built(
    state: ClusterState, typical: list[tuple[Shape, float]], *, stranding: bool
) -> FragmentationIndex:
    index = FragmentationIndex(stranding=stranding)
    index.set_workload(typical, state)
    return index


def test_stranding_counts_until_cpu_is_the_scarcer_resource_by_the_margin() -> None:
    state, typical = two_nodes()
    index = built(state, typical, stranding=True)
    assert index.stranding  # all free: CPU share 1.0, GPU share 1.0
    version = index.version
    # Pods without GPUs take 9 of each node's 16 CPUs: free CPU share 7/16 = 0.44 against
    # every GPU free (1.0), far past the margin.
    for name in ("a", "b"):
        state.apply(name, [], 9000, 0, sign=1)
        index.update_node(state, state.row(name))
    assert 7 / 16 + CPU_BINDS_MARGIN < 1.0
    index.set_workload(typical, state)
    assert not index.stranding and index.version > version
    # It now scores exactly as an index that never counts stranding.
    fgd_rule = built(state, typical, stranding=False)
    assert np.array_equal(index.effective_now, fgd_rule.effective_now)
    cands = CandidateFinder(state).find(USUAL)
    assert np.allclose(index.loss(state, cands, 6000, 0), fgd_rule.loss(state, cands, 6000, 0))
    # GPUs taken until the GPU share is within the margin of the CPU share: counted again.
    for name in ("a", "b"):
        allocations = [GPUAllocation(f"{name}-gpu{i}", 100, 0) for i in range(2)]
        state.apply(name, allocations, 0, 0, sign=1)
        index.update_node(state, state.row(name))
    index.set_workload(typical, state)  # CPU share 0.44 + 0.1 >= GPU share 0.5
    assert index.stranding
    fresh = built(state, typical, stranding=True)
    assert fresh.stranding
    assert np.array_equal(index.effective_now, fresh.effective_now)


def test_an_index_that_may_not_strand_never_starts_to() -> None:
    """FGD's index (``stranding=False``) stays on its own rule whatever binds."""
    state, typical = two_nodes()
    index = built(state, typical, stranding=False)
    for name in ("a", "b"):
        allocations = [GPUAllocation(f"{name}-gpu{i}", 100, 0) for i in range(4)]
        state.apply(name, allocations, 0, 0, sign=1)
        index.update_node(state, state.row(name))
    index.set_workload(typical, state)  # every GPU taken, all CPU free
    assert not index.stranding and not index.may_strand
