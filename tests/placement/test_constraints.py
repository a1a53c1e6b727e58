"""Where a pod may go: models, UUIDs, pools, split count, health, CPU and memory."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracgpu.model import WHOLE_CARD, GPUAllocation, MemoryRequest, NodeInventory
from fracgpu.placement import (
    ClusterView,
    Constraints,
    NoFit,
    NoFitReason,
    Placement,
    PodDemand,
    Policy,
)
from fracgpu.placement.candidates import eligibility
from fracgpu.placement.state import ClusterState
from tests.placement.helpers import container, node, share, uuids

ALL = list(Policy)


def cluster() -> list[NodeInventory]:
    return [
        node("t4", 2, model="Tesla T4"),
        node("a100", 2, model="NVIDIA A100-SXM4-80GB", memory_mib=81920),
        node("v100", 1, model="V100M16", pool="batch"),
    ]


def where(view: ClusterView, demand: PodDemand, policy: Policy) -> set[str]:
    result = view.place(demand, policy)
    assert isinstance(result, Placement), result
    return {result.node}


@pytest.mark.parametrize("policy", ALL)
def test_include_models_matches_substrings_case_insensitively(policy: Policy) -> None:
    view = ClusterView(cluster())
    assert where(view, share(10, constraints=Constraints(include_models=("a100",))), policy) == {
        "a100"
    }


@pytest.mark.parametrize("policy", ALL)
def test_exclude_models(policy: Policy) -> None:
    view = ClusterView(cluster())
    excluded = Constraints(exclude_models=("T4", "A100"))
    assert where(view, share(10, constraints=excluded), policy) == {"v100"}


def test_exact_models_do_not_match_substrings() -> None:
    view = ClusterView([node("m16", 1, model="V100M16"), node("m32", 1, model="V100M32")])
    loose = Constraints(include_models=("V100",))
    exact = Constraints(include_models=("V100",), exact_models=True)
    assert isinstance(view.place(share(10, constraints=loose)), Placement)
    result = view.place(share(10, constraints=exact))
    assert isinstance(result, NoFit) and result.reason is NoFitReason.NEVER
    assert where(
        view,
        share(10, constraints=Constraints(include_models=("v100m32",), exact_models=True)),
        Policy.BINPACK,
    ) == {"m32"}


@pytest.mark.parametrize("policy", ALL)
def test_uuid_include_and_exclude(policy: Policy) -> None:
    view = ClusterView(cluster())
    only = Constraints(include_uuids=("t4-gpu1",))
    result = view.place(share(10, constraints=only), policy)
    assert isinstance(result, Placement) and uuids(result) == ["t4-gpu1"]
    avoid = Constraints(include_models=("T4",), exclude_uuids=("t4-gpu0",))
    result = view.place(share(10, constraints=avoid), policy)
    assert isinstance(result, Placement) and uuids(result) == ["t4-gpu1"]


@pytest.mark.parametrize("policy", ALL)
def test_pools(policy: Policy) -> None:
    view = ClusterView(cluster())
    assert where(view, share(10, constraints=Constraints(pools=("batch",))), policy) == {"v100"}
    result = view.place(share(10, constraints=Constraints(pools=("nowhere",))), policy)
    assert isinstance(result, NoFit) and result.reason is NoFitReason.NEVER


@pytest.mark.parametrize("policy", ALL)
def test_split_count_caps_containers_per_gpu(policy: Policy) -> None:
    view = ClusterView([node("a", 1, split_count=2), node("b", 1)], default_split_count=3)
    for _ in range(2):
        view.allocate("a", [GPUAllocation("a-gpu0", 10, 256)])
    for _ in range(3):
        view.allocate("b", [GPUAllocation("b-gpu0", 10, 256)])
    result = view.place(share(10), policy)
    assert isinstance(result, NoFit) and result.reason is NoFitReason.NOT_NOW
    view.release("b", [GPUAllocation("b-gpu0", 10, 256)])
    assert where(view, share(10), policy) == {"b"}


@pytest.mark.parametrize("policy", ALL)
def test_unhealthy_and_mig_gpus_are_never_chosen(policy: Policy) -> None:
    view = ClusterView([node("a", 3, unhealthy=(0,), mig=(1,))])
    result = view.place(share(10), policy)
    assert isinstance(result, Placement) and uuids(result) == ["a-gpu2"]
    whole = PodDemand((container("main", 100, WHOLE_CARD, gpus=2),))
    never = view.place(whole, policy)
    assert isinstance(never, NoFit) and never.reason is NoFitReason.NEVER


@pytest.mark.parametrize("policy", ALL)
def test_node_cpu_and_memory_must_fit(policy: Policy) -> None:
    view = ClusterView(
        [node("small", 1, cpu_milli=2000, host_memory_mib=4096), node("big", 1, cpu_milli=64000)]
    )
    assert where(view, share(10, cpu_milli=3000), policy) == {"big"}
    assert where(view, share(10, host_memory_mib=8192), policy) == {"big"}
    view.allocate("big", [], cpu_milli=63000)
    result = view.place(share(10, cpu_milli=3000), policy)
    assert isinstance(result, NoFit) and result.reason is NoFitReason.NOT_NOW


@pytest.mark.parametrize("policy", ALL)
def test_gpu_memory_must_fit_and_percentages_resolve_per_card(policy: Policy) -> None:
    view = ClusterView([node("t4", 1), node("a100", 1, memory_mib=81920)])
    half = PodDemand((container("main", 10, MemoryRequest(percent=50)),))
    result = view.place(half, policy)
    assert isinstance(result, Placement)
    allocation = result.containers[0].devices[0]
    card = 16384 if result.node == "t4" else 81920
    assert allocation.memory_mib == card // 2
    # 20 GiB fits only the A100.
    assert where(view, share(10, memory_mib=20480), policy) == {"a100"}
    view.allocate("a100", [GPUAllocation("a100-gpu0", 10, 70000)])
    result = view.place(share(10, memory_mib=20480), policy)
    assert isinstance(result, NoFit) and result.reason is NoFitReason.NOT_NOW


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=6),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=6),
    st.lists(st.integers(0, 5), max_size=4),
)
def test_gpus_named_by_uuid_are_masked_as_each_gpu_allows(
    gpus: list[int],
    included: list[tuple[int, int]],
    excluded: list[tuple[int, int]],
    churned: list[int],
) -> None:
    """The UUID mask comes from a UUID -> slots index kept as nodes come and go (nodes leave
    and come back, the arrays are compacted, two nodes may report one UUID): it must equal
    asking each live GPU whether the constraints allow it."""
    state = ClusterState(100)

    def inventory(i: int) -> NodeInventory:
        shared = node(f"n{i}", gpus[i])  # n0's UUIDs again on the last node
        if i == len(gpus) - 1 and i > 0:
            shared = NodeInventory(
                shared.name,
                node("n0", gpus[i]).devices,
                shared.cpu_milli,
                shared.memory_mib,
            )
        return shared

    for i in range(len(gpus)):
        state.add_node(inventory(i), split_count=4)
    for i in churned:
        if i < len(gpus):
            state.remove_node(f"n{i}")
            for _ in range(20):  # enough removals to make the arrays compact
                state.add_node(node("spare", 1), split_count=4)
                state.remove_node("spare")
            state.add_node(inventory(i), split_count=4)
    constraints = Constraints(
        include_uuids=tuple(f"n{n}-gpu{g}" for n, g in included),
        exclude_uuids=tuple(f"n{n}-gpu{g}" for n, g in excluded),
    )
    masked, _ = eligibility(state, constraints)
    expected = [
        bool(state.g_live[slot]) and constraints.allows(device)
        for slot, device in enumerate(state.devices)
    ]
    assert masked.tolist() == expected
