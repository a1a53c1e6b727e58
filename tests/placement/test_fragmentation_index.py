"""The fragmentation index recounts changed nodes lazily, in one pass: its sums must equal an
index built from scratch over the same state."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fracgpu.model import WHOLE_CARD, GPUAllocation
from fracgpu.placement import ClusterView, Constraints, Placement, PodDemand, Policy
from fracgpu.placement.candidates import CandidateFinder
from fracgpu.placement.fragmentation import (
    MODEL_RARITY_GPUS,
    SCARCE_NODE_GPUS,
    FragmentationIndex,
)
from fracgpu.placement.scarcity import (
    LAST_FEW,
    MAX_DEAD_KINDS,
    ScarcityTable,
    covers,
    kind_of,
    scarcity,
)
from fracgpu.placement.state import ClusterState
from fracgpu.placement.workload import WorkloadModel, shape_of
from tests.placement.helpers import container, node, share

MODELS = ("Tesla T4", "NVIDIA A100")
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


def test_opening_an_untouched_node_costs_by_the_scarcity_of_its_kind() -> None:
    """A one-GPU share scored on every GPU: candidates on untouched nodes lose
    SCARCE_NODE_GPUS x (ln(U / D) + LAST_FEW x (1 / D - 1 / U)) GPUs more than without that
    cost, for their kind (U untouched nodes, D of them with at least its GPUs: CPU, memory and
    model are alike here); those on a node already in use lose the same. FGD's index
    (``keep_whole_nodes=False``) has no such cost."""
    state, index = counted(8)
    state.apply("n1", [GPUAllocation("n1-gpu0", 10, 0)], 0, 0, sign=1)  # n1 is in use
    plain = FragmentationIndex(keep_whole_nodes=False)
    plain.shapes, plain.weights = index.shapes, index.weights
    plain.rebuild(state)
    index.rebuild(state)
    finder = CandidateFinder(state)
    demand = share(10, 1024)
    cands = finder.find(demand)
    extra = index.loss(state, cands, 0, 0) - plain.loss(state, cands, 0, 0)
    used = np.array([state.node_names[r] == "n1" for r in cands.rows])
    assert np.allclose(extra[used], 0.0)
    untouched_gpus = [i % 4 for i in range(8) if i % 4 > 0 and f"n{i}" != "n1"]
    gpus = np.array([state.n_count[r] for r in cands.rows[~used]])
    hosts = np.array([sum(1 for g in untouched_gpus if g >= n) for n in gpus])
    u = len(untouched_gpus)
    scarce = np.log(u / hosts) + LAST_FEW * (1 / hosts - 1 / u)
    assert scarce.max() > scarce.min()  # the 3-GPU nodes are scarcer than the 1-GPU ones
    assert np.allclose(extra[~used], SCARCE_NODE_GPUS * scarce * state.gpu_units)
    # Without the scarcity part (the per-class cache's scores) nothing is added.
    bare = index.loss(state, cands, 0, 0, scarce=False) - plain.loss(state, cands, 0, 0)
    assert np.allclose(bare, 0.0)


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


def rare_model_cluster() -> ClusterState:
    """Six T4 nodes and one A100 node, 4 GPUs each, each with a sliver taken (so no node is
    untouched and the opening costs stay out)."""
    state = ClusterState(100)
    for i in range(6):
        state.add_node(node(f"t{i}", 4, model="Tesla T4"), split_count=4)
    state.add_node(node("a", 4, model="NVIDIA A100"), split_count=4)
    for name in [f"t{i}" for i in range(6)] + ["a"]:
        state.apply(name, [GPUAllocation(f"{name}-gpu0", 5, 0)], 0, 0, sign=1)
    return state


@pytest.mark.parametrize("limited_share", [0.0, 0.25, 0.5])
def test_a_gpu_of_a_rare_model_costs_as_much_as_pods_ask_for_models(limited_share: float) -> None:
    """Taking a GPU costs MODEL_RARITY_GPUS x (frequency of the shapes limited to models) x
    units taken x ln(free compute / free compute of its model), on top of the usable capacity
    lost: 28 GPUs, 4 of them A100, the same sliver taken on each node, so an A100 costs ln 7
    and a T4 ln(7 / 6). Without pods limited to models it costs nothing."""
    state = rare_model_cluster()
    anywhere = shape_of(share(100, 0))
    on_a100 = shape_of(share(100, 0, constraints=Constraints(include_models=("A100",))))
    assert anywhere is not None and on_a100 is not None
    typical = [(anywhere, 1.0 - limited_share)] + (
        [(on_a100, limited_share)] if limited_share else []
    )
    with_rarity, without = FragmentationIndex(), FragmentationIndex(model_rarity=0.0)
    for index in (with_rarity, without):
        index.set_workload(typical, state)
    cands = CandidateFinder(state).find(share(100, 0))
    extra = with_rarity.loss(state, cands, 0, 0) - without.loss(state, cands, 0, 0)
    on_a = np.array([state.node_names[r] == "a" for r in cands.rows])
    scale = MODEL_RARITY_GPUS * limited_share * 100
    assert np.allclose(extra[on_a], scale * math.log(28 / 4))
    assert np.allclose(extra[~on_a], scale * math.log(28 / 24))


def test_the_rarity_follows_free_compute_as_the_common_model_fills() -> None:
    """Rarity is of free compute: when five of the six T4 nodes fill up, the T4s left are
    rarer than the A100 node and a GPU there costs more than an A100. It is recounted with
    the workload (the same typical shapes: only the version moves) and left alone for a
    change within RARITY_STEP."""
    state = rare_model_cluster()
    on_a100 = shape_of(share(100, 0, constraints=Constraints(include_models=("A100",))))
    anywhere = shape_of(share(100, 0))
    assert anywhere is not None and on_a100 is not None
    typical = [(anywhere, 0.75), (on_a100, 0.25)]
    index = FragmentationIndex()
    index.set_workload(typical, state)
    a100_slot, t4_slot = state.row("a"), 0
    a100_slot = int(state.n_first[a100_slot])
    assert index.g_rarity[a100_slot] > index.g_rarity[t4_slot]
    for i in range(5):
        name = f"t{i}"
        taken = [GPUAllocation(f"{name}-gpu{g}", 95 if g == 0 else 100, 0) for g in range(4)]
        state.apply(name, taken, 0, 0, sign=1)
        index.update_node(state, state.row(name))
    version = index.version
    index.set_workload(typical, state)
    assert index.version > version
    free_t4, free_a100 = 395.0, 395.0  # one T4 node left, with its sliver taken
    total = free_t4 + free_a100
    assert index.g_rarity[t4_slot] == pytest.approx(math.log(total / free_t4))
    assert index.g_rarity[a100_slot] == pytest.approx(math.log(total / free_a100))
    state.apply("t5", [GPUAllocation("t5-gpu1", 1, 0)], 0, 0, sign=1)  # a sliver: no recount
    index.update_node(state, state.row("t5"))
    version = index.version
    index.set_workload(typical, state)
    assert index.version == version


def three_model_view(*, v100s_all_but_full: bool) -> tuple[ClusterView, PodDemand]:
    """One A100 node, six V100 and six T4 nodes of 4 GPUs, a sliver taken on each (no node
    is untouched), then 64 pods seen, a quarter of them asking for a T4 (the rarity is
    recounted with the workload, every 64 arrivals). Returns the view and a whole-GPU pod
    that could run anywhere."""
    nodes = [node("a", 4, model="NVIDIA A100", cpu_milli=64000)]
    nodes += [node(f"v{i}", 4, model="Tesla V100", cpu_milli=64000) for i in range(6)]
    nodes += [node(f"t{i}", 4, model="Tesla T4", cpu_milli=64000) for i in range(6)]
    view = ClusterView(nodes)
    anywhere = PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=16000)
    on_t4 = dataclasses.replace(anywhere, constraints=Constraints(include_models=("T4",)))
    for inventory in nodes:
        view.allocate(inventory.name, [GPUAllocation(f"{inventory.name}-gpu0", 5, 0)])
    if v100s_all_but_full:  # v0 keeps 2.95 GPUs free, the others nothing
        view.allocate("v0", [GPUAllocation("v0-gpu1", 100, 0)])
        for i in range(1, 6):
            taken = [GPUAllocation(f"v{i}-gpu{g}", 100, 0) for g in range(1, 4)]
            view.allocate(f"v{i}", [*taken, GPUAllocation(f"v{i}-gpu0", 95, 0)])
    for i in range(64):
        view.observe(on_t4 if i % 4 == 0 else anywhere)
    return view, anywhere


def test_pods_that_could_run_anywhere_leave_a_rare_model_alone() -> None:
    """None of the pods has asked for the A100 yet. A pod that could run anywhere loses the
    same usable capacity on the A100 node (listed first, so it wins the tie) and on a V100
    node; with pods asking for models it takes the V100, leaving the one A100 node to pods
    that may ask for it."""
    view, anywhere = three_model_view(v100s_all_but_full=False)
    result = view.place(anywhere, Policy.FRAGMENTATION)
    assert isinstance(result, Placement)
    assert result.node.startswith("v")


def test_pods_that_could_run_anywhere_use_a_rare_model_once_the_others_fill() -> None:
    """As above, but the V100s are all but full: 2.95 GPUs free against the A100 node's
    3.95, so the V100s are now the rarer, and the pod takes the A100 (it would take the V100
    on a tie: that node is the fuller)."""
    view, anywhere = three_model_view(v100s_all_but_full=True)
    result = view.place(anywhere, Policy.FRAGMENTATION)
    assert isinstance(result, Placement)
    assert result.node == "a"


def test_scarcity_ranks_untouched_nodes_by_what_they_could_host() -> None:
    """Untouched nodes differing in free CPU only: D is the number at least as big, so
    scarcity is ln(U / rank) + LAST_FEW x (1 / rank - 1 / U), rank counted from the top; a
    node in use scores 0."""
    nodes = 40
    state = ClusterState(100)
    for i in range(nodes):
        state.add_node(node(f"n{i}", 2, cpu_milli=1000 * (i + 1)), split_count=4)
    state.apply("n0", [GPUAllocation("n0-gpu0", 10, 0)], 0, 0, sign=1)
    table = ScarcityTable()
    table.rebuild(state)
    costs = table.costs(np.arange(nodes))
    assert costs[0] == 0.0
    at_least = np.arange(nodes - 1, 0, -1)  # n1 is matched by every untouched node
    u = nodes - 1
    assert np.allclose(costs[1:], np.log(u / at_least) + LAST_FEW * (1 / at_least - 1 / u))


def test_a_rare_model_is_scarce_whatever_bigger_nodes_of_other_models_there_are() -> None:
    """Three small A100 nodes among twenty bigger T4 ones: a pod limited to A100 can use no
    T4, so the A100 nodes' D is 3, not 23, and each costs more to open than a T4 node. Each
    T4 node is covered only by the T4 nodes."""
    state = ClusterState(100)
    for i in range(20):
        state.add_node(node(f"t{i}", 8, cpu_milli=96000, model="Tesla T4"), split_count=4)
    for i in range(3):
        state.add_node(node(f"a{i}", 4, cpu_milli=32000, model="NVIDIA A100"), split_count=4)
    table = ScarcityTable()
    table.rebuild(state)
    costs = table.costs(np.arange(23))
    assert np.allclose(costs[:20], math.log(23 / 20) + LAST_FEW * (1 / 20 - 1 / 23))
    assert np.allclose(costs[20:], math.log(23 / 3) + LAST_FEW * (1 / 3 - 1 / 23))
    assert sorted(table.covering().values()) == [3, 20]


def test_in_a_small_cluster_the_commonest_kind_costs_nothing_to_open() -> None:
    """Two nodes, one in use: the other is the only untouched node, so every untouched node
    covers its kind (D = U = 1) and opening it costs nothing (LAST_FEW / D alone made it 6
    GPUs, and pods packed onto the node in use rather than open it). With a second, smaller
    untouched node, the bigger one is the scarcer."""
    state = ClusterState(100)
    state.add_node(node("used", 1, cpu_milli=8000), split_count=4)
    state.add_node(node("big", 2, cpu_milli=32000), split_count=4)
    state.apply("used", [GPUAllocation("used-gpu0", 10, 0)], 0, 0, sign=1)
    table = ScarcityTable()
    table.rebuild(state)
    assert table.costs(np.arange(2)).tolist() == [0.0, 0.0]
    state.add_node(node("small", 1, cpu_milli=8000), split_count=4)
    table.rebuild(state)
    assert np.allclose(table.costs(np.arange(3)), [0.0, math.log(2) + LAST_FEW / 2, 0.0])


def test_a_node_of_mixed_models_is_a_kind_of_its_own() -> None:
    """A node with a T4 and an A100 hosts neither an all-T4 pod of 2 GPUs nor an all-A100
    one: no single-model node covers it and it covers none."""
    state = ClusterState(100)
    state.add_node(node("t", 2, model="Tesla T4"), split_count=4)
    mixed = node("m", 2, model="Tesla T4")
    devices = (mixed.devices[0], dataclasses.replace(mixed.devices[1], model="NVIDIA A100"))
    state.add_node(dataclasses.replace(mixed, devices=devices), split_count=4)
    table = ScarcityTable()
    table.rebuild(state)
    kinds = [kind_of(state, row) for row in range(2)]
    assert kinds[0] is not None and kinds[1] is not None
    assert kinds[0][3] != kinds[1][3]
    assert not covers(kinds[0], kinds[1]) and not covers(kinds[1], kinds[0])
    assert table.covering() == recount(state) == {kinds[0]: 1, kinds[1]: 1}


def recount(state: ClusterState) -> dict[tuple[int, int, int, int], int]:
    """D per kind of untouched node, counted from scratch over every pair of nodes."""
    kinds = [k for k in (kind_of(state, row) for row in range(len(state.n_first))) if k]
    return {k: sum(1 for other in kinds if covers(other, k)) for k in kinds}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 4), st.sampled_from(MODELS)),
        min_size=1,
        max_size=10,
    ),
    st.lists(
        st.tuples(
            st.integers(0, 9),
            st.integers(0, 3),
            st.sampled_from((0, 10, 100)),
            st.sampled_from((0, 1000, 4000)),
            st.booleans(),
        ),
        max_size=40,
    ),
)
def test_the_scarcity_table_equals_a_recount(
    shapes: list[tuple[int, int, str]], changes: list[tuple[int, int, int, int, bool]]
) -> None:
    """Pods come and go (GPU shares, CPU-only pods, whole nodes freed): after each change the
    table kept row by row, and one rebuilt from scratch, hold the untouched nodes and, per
    kind, the D a recount over every pair of untouched nodes gives; ln(U / D) follows."""
    state = ClusterState(100)
    for i, (gpus, cpus, model) in enumerate(shapes):
        state.add_node(node(f"n{i}", gpus, cpu_milli=8000 * cpus, model=model), split_count=4)
    table = ScarcityTable()
    table.rebuild(state)
    held: list[tuple[str, list[GPUAllocation], int]] = []
    for n, gpu, cores, cpu, free_one in changes:
        if free_one and held:
            name, allocations, cpu_taken = held.pop(0)
            state.apply(name, allocations, cpu_taken, 0, sign=-1)
        elif n < len(shapes):
            name = f"n{n}"
            allocations = (
                [GPUAllocation(f"{name}-gpu{gpu}", cores, 0)] if gpu < shapes[n][0] else []
            )
            state.apply(name, allocations, cpu, 0, sign=1)
            held.append((name, allocations, cpu))
        else:
            continue
        table.update_row(state, state.row(name))
        expected = recount(state)
        assert table.covering() == expected
        rebuilt = ScarcityTable()  # and a table grouped from scratch, as after node churn
        rebuilt.rebuild(state)
        assert rebuilt.covering() == expected
        assert rebuilt.untouched == table.untouched
        assert table.untouched == sum(1 for r in range(len(state.n_first)) if kind_of(state, r))
        rows = np.arange(len(state.n_first))
        wanted = [
            scarcity(table.untouched, expected[k]) if (k := kind_of(state, r)) else 0.0
            for r in range(len(rows))
        ]
        assert np.allclose(table.costs(rows), wanted)


def test_kinds_no_node_has_any_more_are_renumbered_away() -> None:
    """CPU-only pods leave a new CPU amount on an untouched node each time: a kind id per
    amount. Ids of kinds no node has any more are dropped now and then (the kind ids held
    elsewhere are told by ``version``), and the table still equals a recount."""
    state = ClusterState(100)
    state.add_node(node("a", 2, cpu_milli=64000), split_count=4)
    state.add_node(node("b", 2, cpu_milli=64000), split_count=4)
    table = ScarcityTable()
    table.rebuild(state)
    version = table.version
    for cpu in range(1, 2 * MAX_DEAD_KINDS):
        state.apply("a", [], cpu, 0, sign=1)
        table.update_row(state, state.row("a"))
        state.apply("a", [], cpu, 0, sign=-1)
        table.update_row(state, state.row("a"))
        assert len(table.kinds) <= MAX_DEAD_KINDS + 2 * 2 + 1
    assert table.version > version
    assert table.covering() == recount(state)
