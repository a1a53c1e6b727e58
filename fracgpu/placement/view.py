"""ClusterView: free capacity per node and GPU, updated incrementally, placed against purely.

State lives in numpy arrays (``ClusterState``); ``place`` finds every candidate at once
(``CandidateFinder``), scores them with the chosen policy (``scoring``) and never changes
the view. The fragmentation policy reads a ``FragmentationIndex`` built from the workload
the view has seen through ``observe``.
"""

import dataclasses
from collections.abc import Iterable

from fracgpu.model import GPUAllocation, MemoryRequest, NodeInventory
from fracgpu.names import CORES_PER_GPU, MAX_MEMORY_SCALING
from fracgpu.placement.api import NoFit, NoFitReason, Placement, PodDemand, Policy
from fracgpu.placement.byclass import ClassChooser
from fracgpu.placement.candidates import CandidateFinder
from fracgpu.placement.fragmentation import HELD_WHOLE_NODES, FragmentationIndex
from fracgpu.placement.nofit import explain, fitting_elsewhere
from fracgpu.placement.recheck import capacity_problem
from fracgpu.placement.scoring import choose
from fracgpu.placement.state import ClusterState
from fracgpu.placement.workload import (
    DEFAULT_MAX_TRACKED,
    Shape,
    WorkloadModel,
    shape_of,
)

DEFAULT_SPLIT_COUNT = 10
# What one pod or reservation holds on a node: GPU allocations, CPU milli, memory MiB.
Usage = tuple[Iterable[GPUAllocation], int, int]
# The most untouched nodes ``held_whole_nodes`` may hold from narrower pods.
MAX_HELD_WHOLE_NODES = 64


def held_whole_nodes_problem(value: int) -> str | None:
    """What is wrong with a ``held_whole_nodes`` value (None: nothing)."""
    if 0 <= value <= MAX_HELD_WHOLE_NODES:
        return None
    return f"use a whole number from 0 (hold none) to {MAX_HELD_WHOLE_NODES}"


# The typical shapes are re-ranked after 1, 2, 4, ... 64 arrivals, then every 64.
REFRESH_EVERY = 64
# The FGD policy's workload: task types counted without decay (the paper reads them from the
# whole trace), the most popular ones covering 95 % of the tasks.
FGD_HALF_LIFE = 10**12
FGD_MAX_SHAPES = 128


class ClusterView:
    """Free capacity of the cluster; ``place`` reads it, ``allocate``/``release`` change it.

    ``gpu_units`` is how many compute units make one GPU (100 = TKEStack cores; a trace
    replay may use 1000 to keep thousandths exact). Every ``cores`` value passed in or out
    is in these units. ``observe`` teaches the fragmentation policy what pods look like.
    ``held_whole_nodes``: the fragmentation policy holds the last this many untouched nodes
    that the multi-GPU pods still expected need from narrower pods (``held_from``).
    """

    def __init__(
        self,
        nodes: Iterable[NodeInventory] = (),
        default_split_count: int = DEFAULT_SPLIT_COUNT,
        *,
        default_memory_scaling: float = 1.0,
        gpu_units: int = CORES_PER_GPU,
        workload: WorkloadModel | None = None,
        held_whole_nodes: int = HELD_WHOLE_NODES,
    ) -> None:
        problem = held_whole_nodes_problem(held_whole_nodes)
        if problem is not None:
            raise ValueError(f"held_whole_nodes={held_whole_nodes}: {problem}")
        if default_split_count < 1:
            raise ValueError(f"default_split_count={default_split_count}: use 1 or more")
        if gpu_units < 1:
            raise ValueError(f"gpu_units={gpu_units}: use 1 or more")
        if not 1.0 <= default_memory_scaling <= MAX_MEMORY_SCALING:
            raise ValueError(
                f"default_memory_scaling={default_memory_scaling}: use 1 to {MAX_MEMORY_SCALING:g}"
            )
        self._default_split_count = default_split_count
        self._default_memory_scaling = default_memory_scaling
        self._state = ClusterState(gpu_units)
        self._finder = CandidateFinder(self._state)
        self._workload = workload if workload is not None else WorkloadModel()
        self._frag = FragmentationIndex(held_whole_nodes=held_whole_nodes)
        self._by_class = ClassChooser()
        # The FGD policy (kept to compare against): its own workload and index, set up only
        # when it is used; ``observe`` only counts task types for it (at most
        # DEFAULT_MAX_TRACKED of them, like the fragmentation policy's shapes).
        self._fgd_workload = WorkloadModel(
            half_life=FGD_HALF_LIFE,
            max_shapes=FGD_MAX_SHAPES,
            max_limited_extra=0,
            keep_wide=False,
        )
        self._fgd = FragmentationIndex(stranding=False, keep_whole_nodes=False, model_rarity=0.0)
        self._fgd_seen = 0
        self._fgd_fixed = False  # set_fgd_workload was called: observe leaves it alone
        for node in nodes:
            self.add_node(node)

    # -- state changes ---------------------------------------------------------------------------
    def add_node(self, node: NodeInventory) -> None:
        self._state.add_node(
            node,
            node.split_count or self._default_split_count,
            node.memory_scaling or self._default_memory_scaling,
        )

    def remove_node(self, name: str) -> None:
        self._state.remove_node(name)

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

    def set_usage(self, node: str, uses: Iterable[Usage]) -> None:
        """Replace everything counted on ``node`` by ``uses`` (allocations, CPU milli, memory
        MiB each), keeping its inventory: a node whose pods or reservations changed is
        recounted without a topology change, so the fragmentation index is not rebuilt.
        Only the GPUs whose counts changed are re-classed: most recounts (a pod that went live
        in place of its reservation) change nothing."""
        if not self._state.has_node(node):
            return
        before = self._state.usage_of(node)
        row = self._state.reset_usage(node)
        if row is None:
            return
        # Summed per GPU first: one array update per GPU, not one per pod.
        cpu = memory = 0
        per_gpu: dict[str, list[int]] = {}
        for allocations, cpu_milli, memory_mib in uses:
            cpu += cpu_milli
            memory += memory_mib
            for alloc in allocations:
                held = per_gpu.get(alloc.uuid)
                if held is None:
                    per_gpu[alloc.uuid] = [alloc.cores, alloc.memory_mib, 1]
                else:
                    held[0] += alloc.cores
                    held[1] += alloc.memory_mib
                    held[2] += 1
        self._state.take(row, cpu, memory, per_gpu)
        after = self._state.usage_of(node)
        if after == before:
            return
        first = self._state.slots_of_row(row).start
        pairs = enumerate(zip(before[1], after[1], strict=True), first)
        changed = [slot for slot, (old, new) in pairs if old != new]
        self._frag.update_node(self._state, row, changed)
        self._fgd.update_node(self._state, row, changed)

    def _apply(
        self,
        node: str,
        allocations: Iterable[GPUAllocation],
        cpu_milli: int,
        memory_mib: int,
        sign: int,
    ) -> None:
        allocations = tuple(allocations)
        row = self._state.apply(node, allocations, cpu_milli, memory_mib, sign)
        if row is not None:
            changed = self._state.slots_of(node, allocations)
            self._frag.update_node(self._state, row, changed)
            self._fgd.update_node(self._state, row, changed)

    def observe(self, demand: PodDemand) -> None:
        """Record that a pod of this shape arrived (placed or not): the fragmentation policy
        keeps the capacity that the frequent shapes need. Call it once per arriving pod."""
        shape = shape_of(demand)
        if shape is None:
            return
        self._workload.observe(shape, demand.cpu_milli, demand.memory_mib)
        if not self._fgd_fixed:
            self._fgd_workload.observe(fgd_task_type(demand, shape))
        seen = self._workload.observations
        if seen % REFRESH_EVERY == 0 or (seen & (seen - 1)) == 0 or not self._frag.active:
            self._frag.set_workload(
                self._workload.typical(),
                self._state,
                samples=self._workload.effective_observations(),
            )

    # -- queries ---------------------------------------------------------------------------------
    @property
    def observations(self) -> int:
        """How many arrivals ``observe`` has recorded."""
        return self._workload.observations

    @property
    def held_whole_nodes(self) -> int:
        return self._frag.held_whole_nodes

    @property
    def gpu_units(self) -> int:
        return self._state.gpu_units

    def nodes(self) -> tuple[NodeInventory, ...]:
        return self._state.inventories()

    def inventory(self, node: str) -> NodeInventory | None:
        """One node's inventory (None when not in the view), without copying the others."""
        return self._state.inventory(node)

    def memory_scaling(self, node: str) -> float:
        """The factor the node's GPU memory was offered with (1.0 for unknown nodes)."""
        return self._state.memory_scaling(node)

    def node_count(self) -> int:
        return self._state.node_count()

    def covers_all_nodes(self, names: set[str] | frozenset[str]) -> bool:
        """Whether ``names`` includes every node of the view (a set test, no Python loop)."""
        return names.issuperset(self._state.live_node_names())

    def gpu_free(self, node: str, uuid: str) -> tuple[int, int, int]:
        """(free cores, free memory MiB, containers) of one GPU."""
        slot = self._state.slot(node, uuid)
        st = self._state
        return int(st.g_free[slot]), int(st.g_mem_free[slot]), int(st.g_cont[slot])

    def node_free(self, node: str) -> tuple[int, int]:
        """(free CPU millicores, free memory MiB) of one node."""
        row = self._state.row(node)
        return int(self._state.n_cpu_free[row]), int(self._state.n_mem_free[row])

    def capacity_problem(
        self,
        node: str,
        allocations: Iterable[GPUAllocation],
        *,
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> str:
        """Empty when ``allocations`` (chosen earlier) still fit ``node`` now, by the same
        rule ``place`` uses; otherwise what no longer has room (the re-check at reserve)."""
        return capacity_problem(
            self._state, node, allocations, cpu_milli=cpu_milli, memory_mib=memory_mib
        )

    def place(
        self, demand: PodDemand, policy: Policy = Policy.BINPACK, *, hold: bool = True
    ) -> Placement | NoFit:
        """The best node and GPU(s) for the pod under ``policy``; never changes the view.
        ``hold=False`` lets the pod onto nodes ``held_from`` it (a queued pod that has waited
        long enough)."""
        _check(demand, self._state.gpu_units)
        chosen = self._choose(demand, policy)
        if policy is not Policy.FRAGMENTATION or not hold or isinstance(chosen, NoFit):
            return chosen
        held = self.held_from(demand, policy)
        if chosen.node not in held:
            return chosen
        # A held node ranks below the last node of a rare kind (``reserved``), but that one
        # is no more held than any other: choose again among the rest.
        mine = demand.constraints.nodes
        rest = (mine if mine is not None else self._state.live_node_names()) - held
        off = dataclasses.replace(
            demand, constraints=dataclasses.replace(demand.constraints, nodes=frozenset(rest))
        )
        elsewhere = self._choose(off, policy) if rest else None
        if isinstance(elsewhere, Placement):
            return elsewhere
        return NoFit(
            NoFitReason.NOT_NOW,
            f"no node has room for this pod now except the last {len(held)} untouched "
            f"node(s), kept whole for the pods of {self._frag.held_width(_gpus(demand))} or more "
            "GPUs that are still expected; it fits once room frees elsewhere or such pods stop "
            f"arriving (held_whole_nodes is {self._frag.held_whole_nodes}; 0 holds none)",
            held=True,
        )

    def _choose(self, demand: PodDemand, policy: Policy) -> Placement | NoFit:
        frag = self._frag
        if policy is Policy.FRAGMENTATION:
            self._frag.sync(self._state)
            placed = self._by_class.place(self._state, self._frag, demand)
            if placed is not None:
                return placed
        elif policy is Policy.FGD:
            frag = self._fgd_index()
        cands = self._finder.find(demand, prefer_most_free=policy is Policy.SPREAD)
        if len(cands) == 0:
            return explain(self._state, self._finder, demand)
        winner = choose(policy, cands, self._state, frag, demand)
        node = self._state.node_names[int(cands.rows[winner])]
        return Placement(node, cands.assignment(winner))

    def held_from(self, demand: PodDemand, policy: Policy) -> frozenset[str]:
        """The nodes ``place`` holds from this pod under ``policy``: with the fragmentation
        policy, the last untouched nodes that the multi-GPU pods still expected need, once
        ``held_whole_nodes`` or fewer are left (``FragmentationIndex.held_rows``), unless the
        pod itself takes as many GPUs as those pods; none with the others. A queue head must
        not wait on them."""
        if policy is not Policy.FRAGMENTATION:
            return frozenset()
        self._frag.sync(self._state)
        rows = self._frag.held_rows(self._state, _gpus(demand))
        return frozenset(self._state.node_names[int(r)] for r in rows)

    def fitting_elsewhere(self, demand: PodDemand, reason: NoFitReason) -> tuple[str, ...]:
        """For a pod ``place`` refused with ``reason``: the nodes outside
        ``demand.constraints.nodes`` that could have held it (``nofit.fitting_elsewhere``).
        Costs a placement pass: call it to word a denial, never to place."""
        return fitting_elsewhere(self._state, self._finder, demand, reason)

    def set_fgd_workload(self, demands: Iterable[PodDemand]) -> None:
        """Fix the FGD policy's target workload to these pods' task types, as the FGD paper's
        simulator does: it counts the task types of the whole trace before replaying it, pods
        without GPUs included (their frequency counts every free GPU as fragmented for them,
        which shifts every score alike but changes which ones round to the same integer).
        From then on ``observe`` no longer changes it. The other policies are not affected."""
        demands = list(demands)
        # The caller's list bounds the task types, so all of them are kept (the FGD paper's
        # target workload); the observed copy keeps the default bound.
        workload = WorkloadModel(
            half_life=FGD_HALF_LIFE,
            max_shapes=max(1, len(demands)),
            max_limited_extra=0,
            keep_wide=False,
            max_tracked=max(DEFAULT_MAX_TRACKED, len(demands)),
        )
        for demand in demands:
            workload.observe(fgd_task_type(demand, shape_of(demand)))
        self._fgd_workload = workload
        self._fgd_fixed = True
        self._fgd_seen = 0

    def _fgd_index(self) -> FragmentationIndex:
        """FGD's index, its task types re-ranked on the same schedule as ``observe`` uses."""
        seen = self._fgd_workload.observations
        last = self._fgd_seen
        due = not self._fgd.active or seen >= 2 * last or seen - last >= REFRESH_EVERY
        if seen != last and due:
            self._fgd.set_workload(self._fgd_workload.typical(), self._state)
            self._fgd_seen = seen
        self._fgd.sync(self._state)
        return self._fgd


def _gpus(demand: PodDemand) -> int:
    """The GPUs the pod asks for in all (what ``held_rows`` compares with a shape's)."""
    return sum(c.gpus for c in demand.containers)


def fgd_task_type(demand: PodDemand, shape: Shape | None) -> Shape:
    """The FGD paper's task type of a pod whose shape is ``shape``: GPU share, GPU count,
    allowed models and CPU as asked (no host memory); a pod without GPUs is a type of its
    own CPU."""
    if shape is None:
        shape = Shape(0, 0, MemoryRequest(mib=0), 0, 0)
    return shape._replace(cpu_milli=demand.cpu_milli, memory_mib=0)


def _check(demand: PodDemand, gpu_units: int) -> None:
    names = [c.container for c in demand.containers]
    if len(set(names)) != len(names):
        raise ValueError(f"container names must be unique within a pod, got {names}")
    if demand.cpu_milli < 0 or demand.memory_mib < 0:
        raise ValueError(
            f"cpu_milli={demand.cpu_milli}, memory_mib={demand.memory_mib}: use 0 or more"
        )
    for c in demand.containers:
        if c.gpus < 1:
            raise ValueError(f'container "{c.container}": gpus={c.gpus}, use 1 or more')
        if not 0 <= c.cores <= gpu_units:
            raise ValueError(
                f'container "{c.container}": cores={c.cores}, use 0..{gpu_units} per GPU'
            )
        if c.memory.mib is not None and c.memory.mib < 0:
            raise ValueError(f'container "{c.container}": memory {c.memory.mib} MiB, use 0 or more')
