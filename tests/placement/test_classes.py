"""Scoring one candidate per class (equal node aggregates, equal GPU state) picks exactly the
winner that scoring every candidate picks."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracgpu.model import GPUAllocation
from fracgpu.placement import ClusterView, Placement, PodDemand, Policy
from fracgpu.placement.byclass import ClassChooser
from fracgpu.placement.classes import StateClasses
from fracgpu.placement.fragmentation import FragmentationIndex
from tests.placement.helpers import node, share


def random_cluster(seed: int) -> tuple[ClusterView, list[PodDemand]]:
    """Many alike nodes (so classes hold several candidates) that differ in every feature
    scoring reads: model, card memory, split count, free CPU, host memory and GPU use."""
    rng = random.Random(seed)
    nodes = [
        node(
            f"n{i}",
            rng.choice([2, 4]),
            model=rng.choice(["Tesla T4", "A100"]),
            memory_mib=rng.choice([16384, 40960]),
            cpu_milli=rng.choice([8000, 16000]),
            host_memory_mib=rng.choice([65536, 131072]),
            split_count=rng.choice([None, 3]),
        )
        for i in range(60)
    ]
    view = ClusterView(nodes)
    demands = [
        share(
            rng.choice([10, 25, 50, 100]),
            rng.choice([0, 1024, 8192]),
            cpu_milli=rng.choice([0, 2000, 6000]),
            host_memory_mib=rng.choice([0, 32768]),
        )
        for _ in range(10)
    ]
    # Multi-GPU pods: their candidates are grouped by node class.
    demands += [share(100, 0, gpus=2, cpu_milli=rng.choice([0, 4000])) for _ in range(2)]
    for demand in demands * 3:
        view.observe(demand)
    for n in nodes:
        roll = rng.random()
        if roll < 0.3:  # CPU and memory taken by pods without GPUs
            view.allocate(n.name, [], rng.choice([4000, 6000]), rng.choice([0, 65536]))
        elif roll < 0.6:
            device = rng.choice(n.devices)
            allocation = GPUAllocation(device.uuid, rng.choice([10, 50]), rng.choice([1024, 4096]))
            view.allocate(n.name, [allocation], rng.choice([0, 2000]))
        elif roll < 0.8:  # the same compute and memory in one slice or in two
            device = n.devices[0]
            halves = rng.random() < 0.5
            for _ in range(2 if halves else 1):
                view.allocate(n.name, [GPUAllocation(device.uuid, 20 if halves else 40, 0)])
    return view, demands


@pytest.mark.parametrize("policy", [Policy.FRAGMENTATION, Policy.FGD])
@pytest.mark.parametrize("by_pair", [True, False], ids=["by-pair", "representatives"])
@pytest.mark.parametrize("seed", range(12))
def test_class_representatives_choose_like_every_candidate(
    seed: int, by_pair: bool, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both shortcuts: deciding pair by pair (``ClassChooser``), and scanning every GPU but
    scoring one candidate per class."""
    fast, demands = random_cluster(seed)
    full, _ = random_cluster(seed)
    placed = 0
    for step, demand in enumerate(demands * 6):
        with monkeypatch.context() as patch:
            if not by_pair:
                patch.setattr(ClassChooser, "place", lambda *_: None)
            got = fast.place(demand, policy)
        with monkeypatch.context() as patch:
            patch.setattr(FragmentationIndex, "representatives", lambda *_, **__: None)
            patch.setattr(ClassChooser, "place", lambda *_: None)
            expected = full.place(demand, policy)
        assert got == expected, f"seed {seed} step {step}"
        if isinstance(got, Placement):
            placed += 1
            for view in (fast, full):
                for held in got.containers:
                    view.allocate(got.node, held.devices, demand.cpu_milli, demand.memory_mib)
    assert placed > 10  # the walk really placed pods and changed the classes


def assert_classes_current(view: ClusterView) -> None:
    """Every GPU's and node's class stands for its current state, as a full re-classing
    would find (class ids differ between numberings: compare what they stand for)."""
    state = view._state
    classes = view._frag.current_classes(state)
    assert classes is not None
    fresh = StateClasses()
    fresh.rebuild(state)
    for slot in range(len(state.g_free)):
        assert (
            classes.slot_features[classes.slot_ids[slot]]
            == fresh.slot_features[fresh.slot_ids[slot]]
        )
    for row in range(len(state.n_first)):
        incremental = classes.node_features[classes.node_ids[row]]
        full = fresh.node_features[fresh.node_ids[row]]
        assert incremental[:2] == full[:2]  # free CPU and memory
        assert [classes.slot_features[i] for i in incremental[2:]] == [
            fresh.slot_features[i] for i in full[2:]
        ]


@settings(max_examples=60, deadline=None)
@given(
    uses=st.lists(
        st.tuples(
            st.integers(0, 5),
            st.integers(0, 3),
            st.sampled_from([0, 10, 50, 100]),
            st.sampled_from(["allocate", "recount", "recount-other"]),
        ),
        max_size=25,
    )
)
def test_reclassing_only_the_changed_gpus_equals_classing_all(
    uses: list[tuple[int, int, int, str]],
) -> None:
    """``allocate`` re-classes only the GPUs a pod uses, and a recount (``set_usage``) only
    the GPUs whose counts changed (none, when it counts what was counted)."""
    nodes = [node(f"n{i}", 4, split_count=3) for i in range(6)]
    view = ClusterView(nodes)
    for demand in [share(10, 1024)] * 3:
        view.observe(demand)
    view.place(share(10, 1024), Policy.FRAGMENTATION)  # builds the index and its classes
    held: dict[str, list[tuple[tuple[GPUAllocation, ...], int, int]]] = {}
    for n, gpu, cores, how in uses:
        name = f"n{n}"
        use = ((GPUAllocation(nodes[n].devices[gpu].uuid, cores, 256),), cores * 10, 0)
        if how == "allocate":
            view.allocate(name, use[0], use[1])
            held.setdefault(name, []).append(use)
        elif how == "recount":  # the same uses again: nothing changes
            view.set_usage(name, held.get(name, []))
        else:  # one pod more, or one fewer, than the view counted
            uses_now = held.setdefault(name, [])
            if uses_now and cores == 0:
                uses_now.pop()
            else:
                uses_now.append(use)
            view.set_usage(name, uses_now)
        assert_classes_current(view)
