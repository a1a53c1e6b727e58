"""Properties over random clusters and pods: never over-commit, place() is pure, release
undoes allocate, and a pod is refused only when no GPU could take it."""

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fracgpu.model import ContainerRequest, GPUDevice, MemoryRequest, NodeInventory
from fracgpu.placement import (
    ClusterView,
    Constraints,
    NoFit,
    NoFitReason,
    Placement,
    PodDemand,
    Policy,
)

MODELS = ("Tesla T4", "A100")
CARDS = (16384, 32768)


@st.composite
def nodes(draw: st.DrawFn) -> list[NodeInventory]:
    out = []
    for n in range(draw(st.integers(1, 4))):
        model = draw(st.sampled_from(MODELS))
        card = draw(st.sampled_from(CARDS))
        devices = tuple(
            GPUDevice(f"n{n}-g{i}", i, model, card, healthy=draw(st.booleans()) or i > 0)
            for i in range(draw(st.integers(0, 4)))
        )
        out.append(
            NodeInventory(
                f"n{n}",
                devices,
                draw(st.sampled_from((4000, 16000))),
                draw(st.sampled_from((8192, 65536))),
                split_count=draw(st.sampled_from((None, 1, 2, 3))),
            )
        )
    return out


@st.composite
def demands(draw: st.DrawFn) -> PodDemand:
    containers = []
    for c in range(draw(st.integers(0, 2))):
        whole = draw(st.booleans())
        gpus = draw(st.integers(1, 3)) if whole or draw(st.booleans()) else 1
        memory = (
            MemoryRequest(percent=draw(st.sampled_from((10, 50, 100))))
            if draw(st.booleans())
            else MemoryRequest(mib=draw(st.sampled_from((0, 1024, 8192, 20000))))
        )
        cores = 100 if whole else draw(st.integers(1, 99))
        containers.append(ContainerRequest(f"c{c}", gpus, cores, memory))
    models = draw(st.sampled_from(((), ("T4",), ("A100",))))
    return PodDemand(
        tuple(containers),
        cpu_milli=draw(st.sampled_from((0, 1000, 3000))),
        memory_mib=draw(st.sampled_from((0, 4096))),
        constraints=Constraints(include_models=models),
    )


@dataclass
class GPU:
    cores: int
    memory: int
    containers: int


def snapshot(view: ClusterView) -> tuple[dict[str, GPU], dict[str, tuple[int, int]]]:
    gpus = {}
    hosts = {}
    for inventory in view.nodes():
        hosts[inventory.name] = view.node_free(inventory.name)
        for d in inventory.devices:
            gpus[d.uuid] = GPU(*view.gpu_free(inventory.name, d.uuid))
    return gpus, hosts


def check_feasible(view: ClusterView, demand: PodDemand, placement: Placement, split: int) -> None:
    inventory = next(n for n in view.nodes() if n.name == placement.node)
    devices = {d.uuid: d for d in inventory.devices}
    gpus, hosts = snapshot(view)
    cpu, mem = hosts[placement.node]
    assert demand.cpu_milli <= cpu and demand.memory_mib <= mem
    assert [c.container for c in placement.containers] == [c.container for c in demand.containers]
    for request, assigned in zip(demand.containers, placement.containers, strict=True):
        assert len({a.uuid for a in assigned.devices}) == request.gpus
        for alloc in assigned.devices:
            device = devices[alloc.uuid]
            assert device.shareable and demand.constraints.allows(device)
            assert alloc.cores == request.cores
            assert alloc.memory_mib == request.memory.resolve(device.memory_mib)
            if request.exclusive:
                free = gpus[alloc.uuid]
                assert (free.cores, free.memory, free.containers) == (100, device.memory_mib, 0)
            gpu = gpus[alloc.uuid]
            gpu.cores -= alloc.cores
            gpu.memory -= alloc.memory_mib
            gpu.containers += 1
            assert gpu.cores >= 0 and gpu.memory >= 0
            assert gpu.containers <= (inventory.split_count or split)


def feasible_single(
    view: ClusterView, demand: PodDemand, split: int, skip: frozenset[str] = frozenset()
) -> bool:
    """Brute force for one container: some node (not in ``skip``) with room and enough
    fitting GPUs."""
    (request,) = demand.containers
    gpus, hosts = snapshot(view)
    for inventory in view.nodes():
        if inventory.name in skip:
            continue
        cpu, mem = hosts[inventory.name]
        if demand.cpu_milli > cpu or demand.memory_mib > mem:
            continue
        fitting = 0
        for d in inventory.devices:
            g = gpus[d.uuid]
            need = request.memory.resolve(d.memory_mib)
            if not d.shareable or not demand.constraints.allows(d):
                continue
            if request.exclusive:
                ok = (g.cores, g.memory, g.containers) == (
                    100,
                    d.memory_mib,
                    0,
                ) and need <= d.memory_mib
            else:
                ok = g.cores >= max(request.cores, 1) and g.memory >= need
                ok = ok and g.containers < (inventory.split_count or split)
            fitting += ok
        if fitting >= request.gpus:
            return True
    return False


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(nodes(), st.lists(st.tuples(demands(), st.sampled_from(list(Policy))), max_size=25))
def test_never_over_commits_and_place_is_pure(
    inventories: list[NodeInventory], pods: list[tuple[PodDemand, Policy]]
) -> None:
    view = ClusterView(inventories, default_split_count=3)
    for demand, policy in pods:
        view.observe(demand)
        before = snapshot(view)
        result = view.place(demand, policy)
        assert snapshot(view) == before  # place() changes nothing
        if isinstance(result, Placement):
            check_feasible(view, demand, result, 3)
            allocs = [a for c in result.containers for a in c.devices]
            view.allocate(result.node, allocs, demand.cpu_milli, demand.memory_mib)
        else:
            assert result.message
    gpus, hosts = snapshot(view)
    assert all(g.cores >= 0 and g.memory >= 0 for g in gpus.values())
    assert all(cpu >= 0 and mem >= 0 for cpu, mem in hosts.values())


@SETTINGS
@given(nodes(), st.lists(st.tuples(demands(), st.sampled_from(list(Policy))), max_size=15))
def test_refuses_single_container_pods_only_when_nothing_fits(
    inventories: list[NodeInventory], pods: list[tuple[PodDemand, Policy]]
) -> None:
    view = ClusterView(inventories, default_split_count=3)
    for demand, policy in pods:
        view.observe(demand)
        result = view.place(demand, policy)
        # The fragmentation policy holds the last hosts of the multi-GPU pods still expected.
        held = view.held_from(demand, policy)
        if isinstance(result, Placement):
            assert result.node not in held
        if len(demand.containers) == 1:
            fits = feasible_single(view, demand, 3)
            if isinstance(result, NoFit) and fits:
                assert result.reason is NoFitReason.NOT_NOW
                assert held and not feasible_single(view, demand, 3, skip=held)
            else:
                assert isinstance(result, Placement) == fits
        if isinstance(result, NoFit) and result.reason is NoFitReason.NEVER:
            empty = ClusterView(inventories, default_split_count=3)
            assert isinstance(empty.place(demand, policy), NoFit)
        if isinstance(result, Placement):
            allocs = [a for c in result.containers for a in c.devices]
            view.allocate(result.node, allocs, demand.cpu_milli, demand.memory_mib)


@SETTINGS
@given(nodes(), st.lists(demands(), min_size=1, max_size=12), demands())
def test_release_undoes_allocate(
    inventories: list[NodeInventory], history: list[PodDemand], probe: PodDemand
) -> None:
    view = ClusterView(inventories, default_split_count=3)
    for demand in history:
        view.observe(demand)
        result = view.place(demand, Policy.FRAGMENTATION)
        if isinstance(result, Placement):
            allocs = [a for c in result.containers for a in c.devices]
            view.allocate(result.node, allocs, demand.cpu_milli, demand.memory_mib)
    before = snapshot(view)
    decisions = {p: view.place(probe, p) for p in Policy}
    result = view.place(probe, Policy.BINPACK)
    if isinstance(result, Placement):
        allocs = [a for c in result.containers for a in c.devices]
        view.allocate(result.node, allocs, probe.cpu_milli, probe.memory_mib)
        view.release(result.node, allocs, probe.cpu_milli, probe.memory_mib)
    assert snapshot(view) == before
    assert {p: view.place(probe, p) for p in Policy} == decisions


@SETTINGS
@given(nodes(), st.lists(demands(), min_size=1, max_size=20), st.lists(demands(), max_size=5))
def test_incremental_scores_match_a_fresh_view(
    inventories: list[NodeInventory], history: list[PodDemand], probes: list[PodDemand]
) -> None:
    """A view updated pod by pod decides like one that sees the same final state at once."""
    live = ClusterView(inventories, default_split_count=3)
    placed = []
    for demand in history:
        live.observe(demand)
        result = live.place(demand, Policy.FRAGMENTATION)
        if isinstance(result, Placement):
            allocs = [a for c in result.containers for a in c.devices]
            live.allocate(result.node, allocs, demand.cpu_milli, demand.memory_mib)
            placed.append((result.node, allocs, demand.cpu_milli, demand.memory_mib))
    fresh = ClusterView(inventories, default_split_count=3)
    for node_name, allocs, cpu, mem in placed:
        fresh.allocate(node_name, allocs, cpu, mem)
    for demand in history:
        fresh.observe(demand)
    for probe in probes:
        assert live.place(probe, Policy.FRAGMENTATION) == fresh.place(probe, Policy.FRAGMENTATION)
