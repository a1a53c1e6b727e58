"""ClusterView: free capacity per node and GPU, updated incrementally, placed against purely.

This is the reference implementation of the placement API (binpack and spread). The
fragmentation-aware policy and vectorised scoring plug in behind the same methods.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

from fracgpu.model import (
    ContainerAssignment,
    ContainerRequest,
    GPUAllocation,
    GPUDevice,
    NodeInventory,
)
from fracgpu.names import CORES_PER_GPU
from fracgpu.placement.api import Constraints, NoFit, NoFitReason, Placement, PodDemand, Policy

DEFAULT_SPLIT_COUNT = 10
MAX_CANDIDATES_IN_MESSAGE = 3


@dataclass
class _GPUState:
    device: GPUDevice
    free_cores: int
    free_memory_mib: int
    containers: int = 0


@dataclass
class _NodeState:
    inventory: NodeInventory
    free_cpu_milli: int
    free_memory_mib: int
    gpus: dict[str, _GPUState] = field(default_factory=dict)


class ClusterView:
    """Free capacity of the cluster; ``place`` reads it, ``allocate``/``release`` change it."""

    def __init__(
        self, nodes: Iterable[NodeInventory] = (), default_split_count: int = DEFAULT_SPLIT_COUNT
    ) -> None:
        if default_split_count < 1:
            raise ValueError(f"default_split_count={default_split_count}: use 1 or more")
        self._default_split_count = default_split_count
        self._nodes: dict[str, _NodeState] = {}
        for node in nodes:
            self.add_node(node)

    # -- state changes -------------------------------------------------------------------
    def add_node(self, node: NodeInventory) -> None:
        if node.name in self._nodes:
            raise ValueError(f"node {node.name!r} is already in the view")
        state = _NodeState(node, node.cpu_milli, node.memory_mib)
        for device in node.devices:
            state.gpus[device.uuid] = _GPUState(device, CORES_PER_GPU, device.memory_mib)
        self._nodes[node.name] = state

    def remove_node(self, name: str) -> None:
        self._nodes.pop(name, None)

    def allocate(
        self,
        node: str,
        allocations: Iterable[GPUAllocation],
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> None:
        """Count an admitted pod. Unknown nodes/GPUs are ignored: the pod still uses them."""
        self._apply(node, allocations, cpu_milli, memory_mib, sign=1)

    def release(
        self,
        node: str,
        allocations: Iterable[GPUAllocation],
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> None:
        self._apply(node, allocations, cpu_milli, memory_mib, sign=-1)

    def _apply(
        self,
        node: str,
        allocations: Iterable[GPUAllocation],
        cpu_milli: int,
        memory_mib: int,
        sign: int,
    ) -> None:
        state = self._nodes.get(node)
        if state is None:
            return
        state.free_cpu_milli -= sign * cpu_milli
        state.free_memory_mib -= sign * memory_mib
        for alloc in allocations:
            gpu = state.gpus.get(alloc.uuid)
            if gpu is None:
                continue
            gpu.free_cores -= sign * alloc.cores
            gpu.free_memory_mib -= sign * alloc.memory_mib
            gpu.containers += sign

    # -- queries ---------------------------------------------------------------------------
    def nodes(self) -> tuple[NodeInventory, ...]:
        return tuple(s.inventory for s in self._nodes.values())

    def gpu_free(self, node: str, uuid: str) -> tuple[int, int, int]:
        """(free cores, free memory MiB, containers) of one GPU."""
        gpu = self._nodes[node].gpus[uuid]
        return gpu.free_cores, gpu.free_memory_mib, gpu.containers

    def place(self, demand: PodDemand, policy: Policy = Policy.BINPACK) -> Placement | NoFit:
        best: tuple[float, Placement] | None = None
        for state in self._nodes.values():
            placed = self._fit_node(state, demand, policy, empty=False)
            if placed is None:
                continue
            score = self._node_score(state, placed, policy)
            if best is None or score < best[0]:
                best = (score, placed)
        if best is not None:
            return best[1]
        return self._no_fit(demand)

    # -- internals -------------------------------------------------------------------------
    def _split_count(self, state: _NodeState) -> int:
        return state.inventory.split_count or self._default_split_count

    def _fit_node(
        self, state: _NodeState, demand: PodDemand, policy: Policy, *, empty: bool
    ) -> Placement | None:
        constraints = demand.constraints
        if not constraints.allows_pool(state.inventory.pool):
            return None
        cpu = state.inventory.cpu_milli if empty else state.free_cpu_milli
        mem = state.inventory.memory_mib if empty else state.free_memory_mib
        if demand.cpu_milli > cpu or demand.memory_mib > mem:
            return None
        # scratch copy of what this pod has taken so far on this node
        taken: dict[str, tuple[int, int, int]] = {}
        assigned: list[ContainerAssignment] = []
        order = sorted(demand.containers, key=lambda c: (-c.gpus, -c.cores))
        for request in order:
            chosen = self._fit_container(state, request, constraints, taken, policy, empty=empty)
            if chosen is None:
                return None
            assigned.append(ContainerAssignment(request.container, chosen))
        by_name = {a.container: a for a in assigned}
        return Placement(
            state.inventory.name, tuple(by_name[c.container] for c in demand.containers)
        )

    def _fit_container(
        self,
        state: _NodeState,
        request: ContainerRequest,
        constraints: Constraints,
        taken: dict[str, tuple[int, int, int]],
        policy: Policy,
        *,
        empty: bool,
    ) -> tuple[GPUAllocation, ...] | None:
        options: list[tuple[float, GPUAllocation]] = []
        for gpu in state.gpus.values():
            device = gpu.device
            if not device.shareable or not constraints.allows(device):
                continue
            t_cores, t_mem, t_count = taken.get(device.uuid, (0, 0, 0))
            free_cores = (CORES_PER_GPU if empty else gpu.free_cores) - t_cores
            free_mem = (device.memory_mib if empty else gpu.free_memory_mib) - t_mem
            count = (0 if empty else gpu.containers) + t_count
            memory = request.memory.resolve(device.memory_mib)
            if request.exclusive:
                if count or free_cores < CORES_PER_GPU or free_mem < device.memory_mib:
                    continue
            elif free_cores < request.cores or free_mem < memory:
                continue
            if count >= self._split_count(state):
                continue
            left = (free_cores - request.cores) / CORES_PER_GPU + (free_mem - memory) / max(
                1, device.memory_mib
            )
            score = left if policy is not Policy.SPREAD else -left
            options.append((score, GPUAllocation(device.uuid, request.cores, memory)))
        if len(options) < request.gpus:
            return None
        options.sort(key=lambda o: (o[0], o[1].uuid))
        chosen = tuple(o[1] for o in options[: request.gpus])
        for alloc in chosen:
            c, m, n = taken.get(alloc.uuid, (0, 0, 0))
            taken[alloc.uuid] = (c + alloc.cores, m + alloc.memory_mib, n + 1)
        return chosen

    def _node_score(self, state: _NodeState, placed: Placement, policy: Policy) -> float:
        free = sum(g.free_cores for g in state.gpus.values()) - sum(
            a.cores for c in placed.containers for a in c.devices
        )
        return float(free) if policy is not Policy.SPREAD else float(-free)

    def _no_fit(self, demand: PodDemand) -> NoFit:
        asked = "; ".join(_describe(c) for c in demand.containers)
        ever = any(
            self._fit_node(s, demand, Policy.BINPACK, empty=True) is not None
            for s in self._nodes.values()
        )
        if not ever:
            return NoFit(
                NoFitReason.NEVER,
                f"no GPU node in the cluster could ever hold this pod ({asked}, "
                f"{demand.cpu_milli}m CPU, {demand.memory_mib} MiB memory): lower the request "
                "or check the GPU model, UUID and pool constraints",
            )
        candidates = sorted(
            (
                (g.free_cores, g.free_memory_mib, s.inventory.name, g.device)
                for s in self._nodes.values()
                if demand.constraints.allows_pool(s.inventory.pool)
                for g in s.gpus.values()
                if g.device.shareable and demand.constraints.allows(g.device)
            ),
            key=lambda t: (-t[0], -t[1], t[2], t[3].index),
        )[:MAX_CANDIDATES_IN_MESSAGE]
        best = ", ".join(
            f"{node}/gpu{dev.index} ({dev.model}) has {cores} cores and {mem} MiB free"
            for cores, mem, node, dev in candidates
        )
        return NoFit(
            NoFitReason.NOT_NOW,
            f"no GPU has room for this pod now ({asked}); best candidates: {best or 'none'}. "
            "Controllers such as Deployments and Jobs retry; a bare pod must be created again",
        )


def _describe(request: ContainerRequest) -> str:
    memory = (
        f"{request.memory.mib} MiB"
        if request.memory.mib is not None
        else f"{request.memory.percent}% of the card's memory"
    )
    return f'container "{request.container}": {request.gpus} GPU x {request.cores} cores + {memory}'
