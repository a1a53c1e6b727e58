"""Every way a pod could be placed right now, as arrays.

A candidate is a node plus the GPUs the pod would take there. Most pods are one container
on one GPU, so every GPU that fits is a candidate (vectorised); a container of whole GPUs
takes the first completely free GPUs of each node (vectorised); anything else (several
containers, several shared GPUs) is fitted node by node with a greedy pass.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fracgpu.model import ContainerAssignment, ContainerRequest, GPUAllocation
from fracgpu.placement.api import Constraints, PodDemand
from fracgpu.placement.fit import gpu_room, host_room
from fracgpu.placement.state import BoolArray, ClusterState, IntArray


@dataclass(frozen=True)
class Candidates:
    """Candidate i: node ``rows[i]``; it takes ``take_*[j]`` from GPU ``slots[j]`` for each pair
    j of candidate i (``pair_cand`` None means pair j belongs to candidate j)."""

    rows: IntArray
    pair_cand: IntArray | None
    slots: IntArray
    take_units: IntArray
    take_mem: IntArray
    take_cont: IntArray
    # Builds the per-container assignment of candidate i (only called for the winner).
    assignment: Callable[[int], tuple[ContainerAssignment, ...]]

    def __len__(self) -> int:
        return len(self.rows)

    def subset(self, chosen: IntArray) -> "Candidates":
        """Candidates ``chosen`` (ascending indices), in that order, with their pairs."""
        if self.pair_cand is None:
            return Candidates(
                self.rows[chosen],
                None,
                self.slots[chosen],
                self.take_units[chosen],
                self.take_mem[chosen],
                self.take_cont[chosen],
                lambda i: self.assignment(int(chosen[i])),
            )
        position = np.full(len(self.rows), -1, np.int64)
        position[chosen] = np.arange(len(chosen))
        keep = position[self.pair_cand] >= 0  # pairs stay grouped by candidate, in order
        return Candidates(
            self.rows[chosen],
            position[self.pair_cand[keep]],
            self.slots[keep],
            self.take_units[keep],
            self.take_mem[keep],
            self.take_cont[keep],
            lambda i: self.assignment(int(chosen[i])),
        )


# Distinct constraints whose masks are kept (each is four bool arrays, ~14 kB at 6,000 GPUs,
# up to twice that as removed nodes' slots pile up before a compaction).
MAX_CACHED_MASKS = 256


def constraint_masks(
    st: ClusterState, constraints: Constraints, first_slot: int = 0, first_row: int = 0
) -> tuple[BoolArray, BoolArray]:
    """(GPU slots from ``first_slot`` on whose model and UUID ``constraints`` allow, node rows
    from ``first_row`` on whose pool and name they allow), live or not: the one place a pod's
    constraints become masks. From slot 0 the pod's UUIDs are looked up in the cluster's
    index (cost follows the pod's list); past it, the few GPUs added since are tested one by
    one (cost follows the new nodes)."""
    models = np.array([constraints.allows_model(m) for m in st.models] or [True])
    gpus: BoolArray = models[st.g_model[first_slot:]]
    if first_slot == 0:
        if constraints.include_uuids:
            named = np.zeros(len(gpus), np.bool_)
            named[st.slots_with_uuids(constraints.include_uuids)] = True
            gpus &= named
        if constraints.exclude_uuids:
            gpus[st.slots_with_uuids(constraints.exclude_uuids)] = False
    elif constraints.include_uuids or constraints.exclude_uuids:
        added = st.devices[first_slot:]
        allows_uuid = constraints.allows_uuid
        gpus &= np.fromiter((allows_uuid(d.uuid) for d in added), np.bool_, count=len(added))
    n_rows = len(st.n_pool) - first_row
    nodes: BoolArray = np.ones(n_rows, np.bool_)
    if constraints.pools:
        allows_pool = constraints.allows_pool
        pools = st.n_pool[first_row:]
        nodes &= np.fromiter((allows_pool(p) for p in pools), np.bool_, count=n_rows)
    if constraints.nodes is not None:
        chosen = constraints.nodes
        names = st.node_names[first_row:]
        nodes &= np.fromiter((n in chosen for n in names), np.bool_, count=n_rows)
    return gpus, nodes


def live_only(st: ClusterState, gpus: BoolArray, nodes: BoolArray) -> tuple[BoolArray, BoolArray]:
    """The masks of ``constraint_masks`` (from slot and row 0) narrowed to what can take work
    now: live nodes, and their live GPUs."""
    live_nodes: BoolArray = nodes & st.n_live
    live_gpus: BoolArray = gpus & st.g_live & live_nodes[st.g_node]
    return live_gpus, live_nodes


def eligibility(st: ClusterState, constraints: Constraints) -> tuple[BoolArray, BoolArray]:
    """(GPU slots ``constraints`` allow and that can take work, node rows they allow),
    computed from scratch."""
    return live_only(st, *constraint_masks(st, constraints))


@dataclass
class _Masks:
    """One constraint's masks. ``gpus`` and ``nodes`` ignore liveness and cover the slots and
    rows that existed when they were last extended; until a compaction renumbers slots
    (``layout``), a node churn only appends, so they are extended by the new nodes instead of
    looking every UUID up again. ``live`` is them narrowed to what was live at ``topology``."""

    layout: int
    gpus: BoolArray
    nodes: BoolArray
    topology: int
    live: tuple[BoolArray, BoolArray]


class CandidateFinder:
    """Finds the candidates of a demand in a ``ClusterState``; caches constraint masks."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._masks: dict[Constraints, _Masks] = {}

    # -- masks ---------------------------------------------------------------------------------
    def allowed(self, constraints: Constraints) -> tuple[BoolArray, BoolArray]:
        """(GPU slots the constraints allow and that can take work, node rows they allow).

        Built once per distinct ``Constraints``; every policy, the no-fit explanation and the
        per-class path read the same masks. A topology change extends them by the nodes
        added and narrows them to what is live; only a compaction builds them again."""
        st = self._state
        cached = self._masks.get(constraints)
        if cached is not None and cached.layout == st.layout_epoch:
            if cached.topology != st.topology_version:
                self._refresh(cached, constraints)
            return cached.live
        gpus, nodes = constraint_masks(st, constraints)
        if cached is None and len(self._masks) >= MAX_CACHED_MASKS:
            # constraints vary per pod: keep it bounded
            self._masks.pop(next(iter(self._masks)))  # the oldest entry
        entry = _Masks(
            st.layout_epoch, gpus, nodes, st.topology_version, live_only(st, gpus, nodes)
        )
        self._masks[constraints] = entry
        return entry.live

    def _refresh(self, masks: _Masks, constraints: Constraints) -> None:
        st = self._state
        first_slot, first_row = len(masks.gpus), len(masks.nodes)
        if first_slot < len(st.g_model) or first_row < len(st.n_pool):
            gpus, nodes = constraint_masks(st, constraints, first_slot, first_row)
            masks.gpus = np.concatenate([masks.gpus, gpus])
            masks.nodes = np.concatenate([masks.nodes, nodes])
        masks.topology = st.topology_version
        masks.live = live_only(st, masks.gpus, masks.nodes)

    def node_room(self, demand: PodDemand, pools: BoolArray) -> BoolArray:
        st = self._state
        room = host_room(
            st.n_cpu_free, st.n_mem_free, cpu_milli=demand.cpu_milli, memory_mib=demand.memory_mib
        )
        result: BoolArray = pools & room
        return result

    def memory_need(self, request: ContainerRequest) -> IntArray:
        """MiB the container needs on each GPU slot (a percentage depends on the card)."""
        st = self._state
        if request.memory.mib is not None:
            return np.full(len(st.g_mem_total), request.memory.mib, np.int64)
        cards, inverse = np.unique(st.g_mem_total, return_inverse=True)
        per_card = np.array([request.memory.resolve(int(c)) for c in cards], dtype=np.int64)
        return per_card[inverse]

    # -- finders ---------------------------------------------------------------------------------
    def find(self, demand: PodDemand, *, prefer_most_free: bool = False) -> Candidates:
        gpus, pools = self.allowed(demand.constraints)
        node_ok = self.node_room(demand, pools)
        if not demand.containers:
            return self._cpu_only(node_ok)
        if len(demand.containers) == 1:
            request = demand.containers[0]
            if request.gpus == 1:
                return self._single_gpu(request, gpus & node_ok[self._state.g_node])
            if request.cores >= self._state.gpu_units:
                return self._whole_gpus(request, gpus & node_ok[self._state.g_node])
        return self._greedy(demand, gpus, node_ok, prefer_most_free)

    def _cpu_only(self, node_ok: BoolArray) -> Candidates:
        rows = np.flatnonzero(node_ok)
        empty = np.zeros(0, np.int64)
        return Candidates(rows, None, empty, empty, empty, empty, lambda _i: ())

    def fits_gpu(self, request: ContainerRequest, mask: BoolArray, need_mem: IntArray) -> BoolArray:
        """GPU slots that could take one GPU of this container now."""
        st = self._state
        room = gpu_room(
            st.g_free,
            st.g_mem_free,
            st.g_cont,
            st.g_mem_total,
            st.g_split,
            cores=request.cores,
            memory=need_mem,
            units=st.gpu_units,
        )
        fits: BoolArray = mask & room
        return fits

    def _single_gpu(self, request: ContainerRequest, mask: BoolArray) -> Candidates:
        st = self._state
        need_mem = self.memory_need(request)
        slots = np.flatnonzero(self.fits_gpu(request, mask, need_mem))
        n = len(slots)
        take_mem = need_mem[slots]

        def assignment(i: int) -> tuple[ContainerAssignment, ...]:
            slot = int(slots[i])
            alloc = GPUAllocation(st.devices[slot].uuid, request.cores, int(take_mem[i]))
            return (ContainerAssignment(request.container, (alloc,)),)

        return Candidates(
            st.g_node[slots],
            None,
            slots,
            np.full(n, request.cores, np.int64),
            take_mem,
            np.ones(n, np.int64),
            assignment,
        )

    def _whole_gpus(self, request: ContainerRequest, mask: BoolArray) -> Candidates:
        """Each node with enough completely free GPUs offers its first ``gpus`` of them."""
        st = self._state
        need_mem = self.memory_need(request)
        free = self.fits_gpu(request, mask, need_mem)
        cum = np.concatenate([[0], np.cumsum(free)])
        before_node = cum[st.n_first]
        per_node = cum[st.n_first + st.n_count] - before_node
        rows = np.flatnonzero(per_node >= request.gpus)
        keep = free & np.isin(st.g_node, rows)
        rank = cum[1:] - before_node[st.g_node]  # 1-based rank among the node's free GPUs
        slots = np.flatnonzero(keep & (rank <= request.gpus))
        cand_of_row = np.full(len(st.n_first), -1, np.int64)
        cand_of_row[rows] = np.arange(len(rows))
        pair_cand = cand_of_row[st.g_node[slots]]
        take_mem = need_mem[slots]
        n = len(slots)

        def assignment(i: int) -> tuple[ContainerAssignment, ...]:
            mine = np.flatnonzero(pair_cand == i)
            allocs = tuple(
                GPUAllocation(st.devices[int(slots[j])].uuid, request.cores, int(take_mem[j]))
                for j in mine
            )
            return (ContainerAssignment(request.container, allocs),)

        return Candidates(
            rows,
            pair_cand,
            slots,
            np.full(n, request.cores, np.int64),
            take_mem,
            np.ones(n, np.int64),
            assignment,
        )

    def _greedy(
        self, demand: PodDemand, gpus: BoolArray, node_ok: BoolArray, prefer_most_free: bool
    ) -> Candidates:
        st = self._state
        needs = [self.memory_need(c) for c in demand.containers]
        widest = max(c.gpus for c in demand.containers)
        any_room = gpus & (st.g_free > 0) & node_ok[st.g_node]
        room_per_node = np.bincount(st.g_node, weights=any_room, minlength=len(st.n_first))
        rows_in: list[int] = []
        pairs: list[tuple[int, int, int, int, int]] = []  # cand, slot, units, mem, containers
        plans: list[tuple[ContainerAssignment, ...]] = []
        for row in np.flatnonzero(room_per_node >= widest):
            plan = fit_on_node(
                st, int(row), demand, gpus, needs, empty=False, prefer_most_free=prefer_most_free
            )
            if plan is None:
                continue
            cand = len(rows_in)
            rows_in.append(int(row))
            plans.append(plan)
            taken: dict[int, list[int]] = {}
            for assigned in plan:
                for alloc in assigned.devices:
                    slot = st.slot(st.node_names[row], alloc.uuid)
                    t = taken.setdefault(slot, [0, 0, 0])
                    t[0] += alloc.cores
                    t[1] += alloc.memory_mib
                    t[2] += 1
            pairs.extend((cand, slot, t[0], t[1], t[2]) for slot, t in taken.items())
        table = np.array(pairs, dtype=np.int64).reshape(len(pairs), 5)
        return Candidates(
            np.array(rows_in, dtype=np.int64),
            table[:, 0],
            table[:, 1],
            table[:, 2],
            table[:, 3],
            table[:, 4],
            lambda i: plans[i],
        )


def fit_on_node(
    st: ClusterState,
    row: int,
    demand: PodDemand,
    allowed: BoolArray,
    needs: list[IntArray],
    *,
    empty: bool,
    prefer_most_free: bool = False,
) -> tuple[ContainerAssignment, ...] | None:
    """Greedy fit of every container on one node (``empty``: as if nothing ran there).

    Containers are fitted largest first; each takes the GPUs left fullest after it (or the
    emptiest ones when ``prefer_most_free``), lowest index on ties.
    """
    s = st.slots_of_row(row)
    if empty:
        if not host_room(
            int(st.n_cpu_total[row]),
            int(st.n_mem_total[row]),
            cpu_milli=demand.cpu_milli,
            memory_mib=demand.memory_mib,
        ):
            return None
        free = np.full(len(s), st.gpu_units, np.int64)
        mem_free = st.g_mem_total[s.start : s.stop].copy()
        cont = np.zeros(len(s), np.int64)
    else:
        free = st.g_free[s.start : s.stop].copy()
        mem_free = st.g_mem_free[s.start : s.stop].copy()
        cont = st.g_cont[s.start : s.stop].copy()
    mem_total = st.g_mem_total[s.start : s.stop]
    split = st.g_split[s.start : s.stop]
    ok = allowed[s.start : s.stop]
    u = st.gpu_units
    order = sorted(
        range(len(demand.containers)),
        key=lambda i: (-demand.containers[i].gpus, -demand.containers[i].cores),
    )
    assigned: dict[int, ContainerAssignment] = {}
    for i in order:
        request = demand.containers[i]
        need = needs[i][s.start : s.stop]
        room = gpu_room(
            free, mem_free, cont, mem_total, split, cores=request.cores, memory=need, units=u
        )
        fit = ok & room
        idx = np.flatnonzero(fit)
        if len(idx) < request.gpus:
            return None
        left = (free[idx] - request.cores) / u + (mem_free[idx] - need[idx]) / np.maximum(
            mem_total[idx], 1
        )
        rank = np.lexsort((idx, -left if prefer_most_free else left))
        chosen = idx[rank[: request.gpus]]
        allocs = []
        for local in chosen:
            free[local] -= request.cores
            mem_free[local] -= need[local]
            cont[local] += 1
            device = st.devices[s.start + int(local)]
            allocs.append(GPUAllocation(device.uuid, request.cores, int(need[local])))
        assigned[i] = ContainerAssignment(request.container, tuple(allocs))
    return tuple(assigned[i] for i in range(len(demand.containers)))
