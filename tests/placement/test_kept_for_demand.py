"""Which untouched nodes ``kept_for_demand`` keeps for the multi-GPU pods still expected, and
how far it trusts a rate it has seen over few arrivals.

``ten_nodes``: ten untouched 8-GPU nodes, one kind. With one-GPU pods and 8-GPU pods arriving
at a per-pod rate p, the 80 free GPUs hold 80 / (1 + 7p) arrivals, 80p / (1 + 7p) of them
8-GPU pods; the nodes are kept once that, plus its square root, reaches the ten left. At
p = 0.2 that is 6.67 + 2.58: not kept when the rate is exact. Seen over 100 arrivals, p is
known to about sqrt(0.2 / 100) = 0.045, and two standard errors above 0.2 (0.289) expect 9.6
such pods, plus 3.1: kept. Over 10,000 arrivals the margin is 0.009 and they are not.
"""

import math

import numpy as np
import pytest

from fracgpu.model import WHOLE_CARD
from fracgpu.placement import PodDemand
from fracgpu.placement.fragmentation import RATE_MARGIN, FragmentationIndex
from fracgpu.placement.state import ClusterState
from fracgpu.placement.workload import WorkloadModel, shape_of
from tests.placement.helpers import container, node

ONE = shape_of(PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=4000))
EIGHT = shape_of(PodDemand((container("main", 100, WHOLE_CARD, gpus=8),), cpu_milli=64000))


def ten_nodes(wide_rate: float, samples: float) -> tuple[ClusterState, FragmentationIndex]:
    assert ONE is not None and EIGHT is not None
    state = ClusterState(100)
    for i in range(10):
        state.add_node(node(f"n{i}", 8, cpu_milli=96000, host_memory_mib=393216), split_count=4)
    index = FragmentationIndex()
    typical = [(ONE, 1 - wide_rate), (EIGHT, wide_rate)]
    index.set_workload(typical, state, samples=samples)
    return state, index


def kept(wide_rate: float, samples: float) -> bool:
    state, index = ten_nodes(wide_rate, samples)
    kinds = index.scarcity.row_kind[:10]
    assert len(set(kinds.tolist())) == 1
    return bool(index.kept_for_demand(state)[kinds[0]])


def test_a_rate_seen_over_few_arrivals_is_taken_at_its_upper_margin() -> None:
    assert RATE_MARGIN == 2.0  # the numbers of the module docstring
    assert not kept(0.2, samples=0)  # exact: 6.67 + 2.58 < 10
    assert kept(0.2, samples=100)
    assert not kept(0.2, samples=10_000)
    # Enough wide pods expected keeps the nodes whatever the margin.
    assert kept(0.3, samples=0)


def test_the_margin_moves_with_the_samples_the_view_has_seen() -> None:
    """Recounted when only ``samples`` changed (the cache key includes it)."""
    state, index = ten_nodes(0.2, samples=100)
    kind = index.scarcity.row_kind[0]
    assert index.kept_for_demand(state)[kind]
    index.set_workload([(ONE, 0.8), (EIGHT, 0.2)], state, samples=1e6)
    assert not index.kept_for_demand(state)[kind]


@pytest.mark.parametrize("observed", [1, 2, 50, 4000, 50_000])
def test_effective_observations_is_the_decayed_count_of_arrivals(observed: int) -> None:
    assert ONE is not None
    model = WorkloadModel(half_life=1000)
    for _ in range(observed):
        model.observe(ONE)
    ages = np.arange(observed, dtype=np.float64)
    direct = float((2.0 ** (-ages / 1000)).sum())
    assert model.effective_observations() == pytest.approx(direct, rel=1e-9)
    assert model.effective_observations() < 1000 / math.log(2) + 1


def test_no_arrivals_rest_on_nothing() -> None:
    assert WorkloadModel().effective_observations() == 0.0
