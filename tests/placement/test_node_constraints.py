"""One constraint model: node sets from nodeSelector / affinity / tolerations become a mask
once per distinct constraint, every policy reads it, and the reserve re-check uses the same
fit rule as placement."""

import pytest

from fracgpu.model import GPUAllocation
from fracgpu.placement import ClusterView, Constraints, NoFit, NoFitReason, Placement, Policy
from fracgpu.placement import candidates as candidates_module
from fracgpu.placement.state import BoolArray, ClusterState
from tests.placement.helpers import node, share

ALL = list(Policy)


def only(*names: str) -> Constraints:
    return Constraints(nodes=frozenset(names))


@pytest.mark.parametrize("policy", ALL)
def test_a_node_set_keeps_every_policy_on_its_nodes(policy: Policy) -> None:
    view = ClusterView([node("a", 2), node("b", 2), node("c", 4)])
    for _ in range(8):  # the fragmentation policies' per-class path is active
        view.observe(share(30))
    result = view.place(share(30, constraints=only("b")), policy)
    assert isinstance(result, Placement) and result.node == "b"
    two = share(100, gpus=2, constraints=only("a"))
    result = view.place(two, policy)
    assert isinstance(result, Placement) and result.node == "a"


def test_a_node_set_and_a_uuid_list_together() -> None:
    view = ClusterView([node("a", 2), node("b", 2)])
    both = Constraints(nodes=frozenset({"b"}), include_uuids=("a-gpu0", "b-gpu1"))
    result = view.place(share(30, constraints=both), Policy.FRAGMENTATION)
    assert isinstance(result, Placement)
    assert [d.uuid for c in result.containers for d in c.devices] == ["b-gpu1"]
    nowhere = Constraints(nodes=frozenset({"b"}), include_uuids=("a-gpu0",))
    refused = view.place(share(30, constraints=nowhere), Policy.FRAGMENTATION)
    assert isinstance(refused, NoFit) and refused.reason is NoFitReason.NEVER


def test_eligibility_is_computed_once_per_distinct_constraint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Equal constraints built anew for each pod (as the webhook builds them) share one mask
    until the nodes change."""
    calls: list[Constraints] = []
    real = candidates_module.eligibility

    def counting(st: ClusterState, constraints: Constraints) -> tuple[BoolArray, BoolArray]:
        calls.append(constraints)
        return real(st, constraints)

    monkeypatch.setattr(candidates_module, "eligibility", counting)
    view = ClusterView([node(f"n{i}", 2) for i in range(10)])
    half = [f"n{i}" for i in range(0, 10, 2)]
    for policy in ALL:
        for _ in range(3):
            result = view.place(share(30, constraints=only(*half)), policy)
            assert isinstance(result, Placement) and result.node in half
            view.allocate(result.node, [a for c in result.containers for a in c.devices])
    assert len(calls) == 1
    view.remove_node("n9")  # churn: masks are recomputed once, not per GPU per pod
    for _ in range(3):
        assert isinstance(view.place(share(30, constraints=only(*half))), Placement)
    assert len(calls) == 2


def test_reserve_recheck_uses_the_placement_fit_rule() -> None:
    """What ``place`` would never choose, the re-check refuses too, with what is left."""
    view = ClusterView([node("a", 2, cpu_milli=8000)], default_split_count=2)
    view.allocate("a", [GPUAllocation("a-gpu0", 100, 1024)])  # a-gpu0 is full
    zero = [GPUAllocation("a-gpu0", 0, 0)]  # 0 cores still need one free unit to run
    assert "a-gpu0 on a has 0 cores" in view.capacity_problem("a", zero)
    assert view.capacity_problem("a", [GPUAllocation("a-gpu1", 0, 0)]) == ""
    view.allocate("a", [GPUAllocation("a-gpu1", 10, 0)])
    whole = [GPUAllocation("a-gpu1", 100, 0)]  # a whole GPU needs it to itself
    assert "a-gpu1" in view.capacity_problem("a", whole)
    three = [GPUAllocation("a-gpu1", 10, 0)] * 2  # split count 2: one slot left
    assert "1 of 2 slices" in view.capacity_problem("a", three)
    assert "8000m CPU" in view.capacity_problem("a", [], cpu_milli=9000)
    assert "no GPUs now" in view.capacity_problem("gone", [])
    placed = view.place(
        share(100, constraints=Constraints(include_uuids=("a-gpu1",))), Policy.BINPACK
    )
    assert isinstance(placed, NoFit)  # the same rule: a-gpu1 is shared, so no whole GPU


def test_whole_gpu_recheck_on_a_free_gpu() -> None:
    view = ClusterView([node("a", 1)])
    assert view.capacity_problem("a", [GPUAllocation("a-gpu0", 100, 16384)]) == ""
    assert "a-gpu0" in view.capacity_problem("a", [GPUAllocation("a-gpu0", 100, 16384)] * 2)


def test_many_distinct_constraints_keep_the_mask_cache_bounded() -> None:
    """A tenant sending pods with ever-new selectors (or UUID lists) costs one mask each and
    cannot grow placement's memory: the oldest masks are dropped past the bound."""
    view = ClusterView([node(f"n{i}", 1) for i in range(20)])
    finder = view._finder
    for i in range(candidates_module.MAX_CACHED_MASKS + 50):
        chosen = frozenset(f"n{j}" for j in range(20) if (i >> (j % 9)) & 1) or None
        uuid = Constraints(nodes=chosen, include_uuids=(f"n{i % 20}-gpu0", f"x{i}"))
        view.place(share(10, constraints=uuid))
    assert len(finder._masks) <= candidates_module.MAX_CACHED_MASKS
