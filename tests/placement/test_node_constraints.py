"""One constraint model: node sets from nodeSelector / affinity / tolerations become a mask
once per distinct constraint, every policy reads it, and the reserve re-check uses the same
fit rule as placement."""

import numpy as np
import pytest

from fracgpu.model import GPUAllocation, GPUDevice, NodeInventory
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
    """Equal constraints built anew for each pod (as the webhook builds them) share one mask;
    a node churn extends it by the nodes added instead of building it again, and only a
    compaction (slots renumbered) builds it from scratch."""
    full_builds: list[Constraints] = []
    real = candidates_module.constraint_masks

    def counting(
        st: ClusterState, constraints: Constraints, first_slot: int = 0, first_row: int = 0
    ) -> tuple[BoolArray, BoolArray]:
        if first_slot == 0 and first_row == 0:
            full_builds.append(constraints)
        return real(st, constraints, first_slot, first_row)

    monkeypatch.setattr(candidates_module, "constraint_masks", counting)
    view = ClusterView([node(f"n{i}", 2) for i in range(10)])
    half = [f"n{i}" for i in range(0, 10, 2)]
    for policy in ALL:
        for _ in range(3):
            result = view.place(share(30, constraints=only(*half)), policy)
            assert isinstance(result, Placement) and result.node in half
            view.allocate(result.node, [a for c in result.containers for a in c.devices])
    assert len(full_builds) == 1
    view.remove_node("n8")  # churn: the mask follows it without a rebuild
    for _ in range(3):
        result = view.place(share(30, constraints=only(*half)))
        assert isinstance(result, Placement) and result.node in half[:4]
    view.add_node(node("n8", 2))  # back, in new slots: the extension finds it
    assert {_placed_node(view, only("n8")) for _ in range(2)} == {"n8"}
    assert len(full_builds) == 2  # only({"n8"}) is a new constraint
    for _ in range(40):  # enough churn to compact the arrays: slots renumbered
        view.add_node(node("spare", 1))
        view.remove_node("spare")
    assert _placed_node(view, only(*half)) in half
    assert len(full_builds) == 3


def _placed_node(view: ClusterView, constraints: Constraints) -> str:
    result = view.place(share(10, constraints=constraints))
    assert isinstance(result, Placement)
    return result.node


def test_masks_kept_across_churn_equal_masks_built_anew() -> None:
    """The kept masks, extended and narrowed at every churn, are what a fresh build gives:
    nodes leave, come back in new slots, arrive after a constraint naming their GPUs was
    first seen, report a UUID another node also reports, and the arrays get compacted."""
    rng = np.random.default_rng(5)
    state = ClusterState(gpu_units=100)
    finder = candidates_module.CandidateFinder(state)
    names = [f"n{i}" for i in range(12)]
    models = ("Tesla T4", "NVIDIA A100")
    constraints = [
        Constraints(include_uuids=("n3-gpu0", "n3-gpu1", "n11-gpu1", "n5-gpu0")),
        Constraints(exclude_uuids=("n2-gpu0", "n7-gpu1")),
        Constraints(include_models=("A100",), nodes=frozenset(names[::3])),
        Constraints(pools=("p1",), include_uuids=("n4-gpu1", "n9-gpu0", "n10-gpu0")),
        Constraints(),
    ]

    def inventory(name: str) -> NodeInventory:
        i = int(name[1:])
        return node(name, 2, model=models[i % 2], pool=f"p{i % 3}")

    for name in names[:6]:
        state.add_node(inventory(name), split_count=4)
    compactions = state.layout_epoch
    for step in range(300):
        name = names[int(rng.integers(len(names)))]
        if state.has_node(name):
            state.remove_node(name)
        else:
            state.add_node(inventory(name), split_count=4)
        if step % 50 == 25:  # another node reporting one of n3's UUIDs comes or goes
            if state.has_node("twin"):
                state.remove_node("twin")
            else:
                twin = (GPUDevice("n3-gpu0", 0, "Tesla T4", 16384),)
                state.add_node(NodeInventory("twin", twin, 8000, 1), split_count=4)
        for kept in constraints[int(rng.integers(len(constraints))) :]:
            gpus, nodes = finder.allowed(kept)
            fresh_gpus, fresh_nodes = candidates_module.eligibility(state, kept)
            assert gpus.tolist() == fresh_gpus.tolist(), (step, kept)
            assert nodes.tolist() == fresh_nodes.tolist(), (step, kept)
    assert state.layout_epoch > compactions + 2  # the arrays were compacted along the way


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
