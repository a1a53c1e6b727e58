"""Deciding pair by pair (``ClassChooser``) picks exactly what scanning every GPU picks, and
the pair index (``ClassPairs``) agrees with a brute-force grouping of the slots."""

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fracgpu.model import WHOLE_CARD, ContainerRequest, GPUAllocation, MemoryRequest
from fracgpu.placement import ClusterView, Constraints, Placement, PodDemand, Policy
from fracgpu.placement.byclass import ClassChooser
from fracgpu.placement.pairs import ClassPairs
from tests.placement.helpers import allocations, container, node, reserve_cluster, share

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=200),
    st.data(),
)
def test_pairs_agree_with_grouping_the_slots(
    node_sizes: list[int], moves: list[tuple[int, int]], data: st.DataObject
) -> None:
    """Nodes of ``node_sizes`` GPUs (some with none) move between node classes; a node class
    id stands for one list of GPU classes, as in ``StateClasses``."""
    firsts = [sum(node_sizes[:i]) for i in range(len(node_sizes))]
    gpu_classes: dict[tuple[int, int], list[int]] = {}  # (size, class) -> its GPU classes
    pairs = ClassPairs()
    truth: dict[int, tuple[int, int]] = {}  # slot -> pair
    for row, choice in moves:
        if row >= len(node_sizes):
            continue
        size = node_sizes[row]
        key = (size, choice)
        if key not in gpu_classes:
            gpu_classes[key] = data.draw(st.lists(st.integers(0, 2), min_size=size, max_size=size))
        node_id = list(gpu_classes).index(key)
        pairs.move_node(firsts[row], node_id, gpu_classes[key])
        for offset, gpu_id in enumerate(gpu_classes[key]):
            truth[firsts[row] + offset] = (node_id, gpu_id)
        groups: dict[tuple[int, int], list[int]] = {}
        for member, pair in truth.items():
            groups.setdefault(pair, []).append(member)
        assert sorted(pairs.pairs()) == sorted(groups)
        assert len(pairs) == len(groups)
        for pair, members in groups.items():
            assert pairs.lowest(pair) == min(members)


def test_stale_heap_entries_are_bounded() -> None:
    pairs = ClassPairs()
    for step in range(10_000):
        pairs.move_node((step % 4) * 2, step % 3, (0, step % 3))
    assert pairs._entries <= 2 * 4 + 64
    assert {pairs.lowest(p) for p in pairs.pairs()} <= set(range(8))


MODELS = ("Tesla T4", "A100")


@st.composite
def requests(draw: st.DrawFn) -> PodDemand:
    """Mostly one-GPU pods (the chooser's case), some it leaves to the scan."""
    kind = draw(st.sampled_from(["share", "share", "share", "whole", "two", "pool"]))
    memory = (
        MemoryRequest(percent=draw(st.sampled_from((10, 50, 100))))
        if draw(st.booleans())
        else MemoryRequest(mib=draw(st.sampled_from((0, 1024, 8192))))
    )
    cores = 100 if kind == "whole" else draw(st.sampled_from((0, 10, 25, 50, 99)))
    gpus = 2 if kind == "two" else 1
    models = draw(st.sampled_from(((), ("T4",), ("A100",))))
    return PodDemand(
        (ContainerRequest("main", gpus, cores, memory),),
        cpu_milli=draw(st.sampled_from((0, 1000, 6000))),
        memory_mib=draw(st.sampled_from((0, 4096))),
        constraints=Constraints(include_models=models, pools=("a",) if kind == "pool" else ()),
    )


def cluster(nodes: int, seed: int) -> ClusterView:
    """Alike nodes in two pools, so pairs hold many slots and few pairs exist."""
    return ClusterView(
        [
            node(
                f"n{i}",
                2 + (i + seed) % 3 // 2,
                model=MODELS[(i * 7 + seed) % 5 // 4],
                cpu_milli=8000,
                host_memory_mib=16384,
                pool="ab"[i % 2],
                split_count=3 if (i + seed) % 4 == 0 else None,
            )
            for i in range(nodes)
        ],
        default_split_count=4,
    )


# What happens between decisions besides placing: a pod leaves, a node's use is recounted,
# a node leaves and comes back (a topology change renumbers the classes).
EVENTS = st.sampled_from(["place", "place", "place", "place", "release", "recount", "replace"])


@SETTINGS
@given(
    st.integers(1, 10),
    st.integers(0, 3),
    st.lists(st.tuples(requests(), EVENTS), min_size=1, max_size=40),
)
def test_pair_by_pair_chooses_like_every_candidate(
    nodes: int, seed: int, steps: list[tuple[PodDemand, str]]
) -> None:
    fast, full = cluster(nodes, seed), cluster(nodes, seed)
    held: list[tuple[str, tuple[GPUAllocation, ...], PodDemand]] = []
    with pytest.MonkeyPatch.context() as patch:
        for step, (demand, event) in enumerate(steps):
            for view in (fast, full):
                view.observe(demand)
            got = fast.place(demand, Policy.FRAGMENTATION)
            patch.setattr(ClassChooser, "place", lambda *_: None)
            expected = full.place(demand, Policy.FRAGMENTATION)
            patch.undo()
            assert got == expected, f"step {step}"
            if isinstance(got, Placement):
                allocations = tuple(a for c in got.containers for a in c.devices)
                held.append((got.node, allocations, demand))
                for view in (fast, full):
                    view.allocate(got.node, allocations, demand.cpu_milli, demand.memory_mib)
            if event == "release" and held:
                name, allocations, gone = held.pop(0)
                for view in (fast, full):
                    view.release(name, allocations, gone.cpu_milli, gone.memory_mib)
            elif event == "recount" and held:
                name = held[-1][0]
                uses = [(a, d.cpu_milli, d.memory_mib) for n, a, d in held if n == name]
                for view in (fast, full):
                    view.set_usage(name, uses)
            elif event == "replace":
                name = f"n{step % nodes}"
                inventory = fast.inventory(name)
                assert inventory is not None
                held = [h for h in held if h[0] != name]
                for view in (fast, full):
                    view.remove_node(name)
                    view.add_node(inventory)


def test_alike_nodes_are_decided_by_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a cluster of alike nodes the chooser answers every one-GPU decision itself."""
    answers: list[Placement | None] = []
    place = ClassChooser.place

    def recorded(self: ClassChooser, *args: Any) -> Placement | None:
        answers.append(place(self, *args))
        return answers[-1]

    monkeypatch.setattr(ClassChooser, "place", recorded)
    view = cluster(50, 0)
    pod = share(10, 1024, cpu_milli=1000)
    for _ in range(40):
        view.observe(pod)
        placed = view.place(pod, Policy.FRAGMENTATION)
        assert isinstance(placed, Placement)
        view.allocate(placed.node, [a for c in placed.containers for a in c.devices], 1000)
        assert answers[-1] == placed
    assert len(answers) == 40


def placed_by_both_paths(fast: ClusterView, full: ClusterView, demand: PodDemand) -> Placement:
    """The per-class path's placement on ``fast``, checked against the full scan's on ``full``
    (two views kept in the same state)."""
    placed = fast.place(demand, Policy.FRAGMENTATION)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ClassChooser, "place", lambda *_: None)
        expected = full.place(demand, Policy.FRAGMENTATION)
    assert isinstance(placed, Placement)
    assert placed == expected
    return placed


def test_cached_scores_follow_the_untouched_nodes() -> None:
    """Opening a node changes what the other untouched nodes cost to open (their kind's
    scarcity), so scores cached by class must not outlive it. Untouched X (most memory)
    and A1, A2 (more CPU, matched by Z): A1 is opened first (Z also hosts what A hosts);
    once Z is taken too, X and A2 are equally scarce and the tie goes to X, listed first.
    Scores of A2's class cached before Z was opened would still send the pod to A2."""

    def build() -> ClusterView:
        return ClusterView(
            [
                node("x", 1, cpu_milli=8000, host_memory_mib=65536),
                node("a1", 1, cpu_milli=16000, host_memory_mib=16384),
                node("a2", 1, cpu_milli=16000, host_memory_mib=16384),
                node("z", 1, model="A100", cpu_milli=32000, host_memory_mib=16384),
            ]
        )

    plain = share(100, 0)
    on_z = share(100, 0, constraints=Constraints(include_models=("A100",)))
    fast, full = build(), build()
    for view in (fast, full):
        for _ in range(8):  # the workload stays as it is from here on
            view.observe(plain)
            view.observe(on_z)
    got: list[str] = []
    for demand in (plain, on_z, plain):
        placed = placed_by_both_paths(fast, full, demand)
        got.append(placed.node)
        for view in (fast, full):
            view.allocate(placed.node, allocations(placed))
    assert got == ["a1", "z", "x"]


def test_cached_kinds_follow_a_renumbered_scarcity_table() -> None:
    """The per-class path keeps each node class's scarcity kind id. CPU-only pods come and go
    on an untouched node until the table renumbers its kinds, while w, freed meanwhile, adds
    a kind that sorts before x's: x's class is unchanged, but its kind id now names another
    kind. The decision must still be the full scan's (GPU-less nodes keep the state classes
    from renumbering, which would hide a stale id)."""

    def build() -> ClusterView:
        view = ClusterView(
            [
                node("x", 1, cpu_milli=8000, host_memory_mib=65536),
                node("w", 1, cpu_milli=4000, host_memory_mib=16384),
                node("a1", 1, cpu_milli=16000, host_memory_mib=16384),
                node("z", 1, model="A100", cpu_milli=32000, host_memory_mib=16384),
                *(node(f"cpu{i}", 0) for i in range(1000)),
            ]
        )
        view.allocate("w", [GPUAllocation("w-gpu0", 10, 0)])
        return view

    plain = share(100, 0)
    fast, full = build(), build()
    for view in (fast, full):
        for _ in range(8):
            view.observe(plain)
    answers = []
    for step in range(2):
        if step:
            for view in (fast, full):
                view.release("w", [GPUAllocation("w-gpu0", 10, 0)])
                for cpu in range(1, 300):  # a kind per CPU amount, gone again at once
                    view.allocate("z", [], cpu_milli=cpu)
                    view.release("z", [], cpu_milli=cpu)
        answers.append(placed_by_both_paths(fast, full, plain).node)
    assert fast._frag.scarcity.version > 2  # the table was renumbered
    assert answers[-1] == "w"  # the cheapest kind to open: every untouched node covers it


def test_pair_by_pair_keeps_the_reserved_node_like_every_candidate() -> None:
    """The reserve is read per node class when options are compared, not cached with the
    scores: a one-GPU pod of 90 CPUs goes to s1 while "big" is the last node of its kind,
    by either path; once s1 and s2 are open nothing is rare and both paths send the next
    one to "big" (holding the last hosts off: ``test_held_nodes`` covers that)."""
    fast, full = reserve_cluster(held_whole_nodes=0), reserve_cluster(held_whole_nodes=0)
    got: list[str] = []
    for cpu in (90000, 90000, 4000, 90000):
        demand = PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=cpu)
        placed = placed_by_both_paths(fast, full, demand)
        got.append(placed.node)
        for view in (fast, full):
            view.allocate(placed.node, allocations(placed), cpu)
    assert got[:2] == ["s1", "s2"]
    assert got[3] == "big"
