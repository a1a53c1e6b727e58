"""Expected fragmentation of each node for the workload's typical shapes, kept incrementally.

For a typical shape s, a GPU's free compute is *usable* when a pod of shape s could take
that GPU (model allowed, enough free compute and memory, below the split count; whole-GPU
shapes need a completely free GPU), and the node itself could host the pod (free CPU and
memory, and enough usable GPUs). All other free compute on the node is fragmented for s.
A node's fragmentation is the frequency-weighted sum over shapes:

    frag(n) = sum_s w_s * (free(n) - ok_s(n) * usable_s(n))

Placing a pod changes only its node, so the policy scores a candidate by how much usable
capacity it destroys: sum_s w_s * (ok_s * usable_s before - ok_s * usable_s after). The
per-node sums ``usable`` and ``count`` are arrays [node, shape], recounted for the nodes that
changed when a score next reads them.

Two costs are added to that loss, for what the typical shapes do not see yet: opening an
untouched node, the more the scarcer its kind (``scarcity``), and taking GPUs of a model few
of the cluster's free GPUs are, as much as the workload has pods limited to models
(``MODEL_RARITY_GPUS``).
"""

import math
from collections.abc import Iterable, Sequence

import numpy as np

from fracgpu.placement.candidates import Candidates
from fracgpu.placement.classes import StateClasses
from fracgpu.placement.scarcity import Kind, ScarcityTable
from fracgpu.placement.state import BoolArray, ClusterState, FloatArray, IntArray
from fracgpu.placement.workload import Shape

# Float noise below this (in units x frequency) is not a difference between candidates.
TIE_TOLERANCE = 1e-7
# Breaking into an untouched node costs this many GPUs times how scarce its kind of node is
# (``scarcity``), whatever shapes have been seen: the pods that need the scarce kind whole may
# not have come yet. (A second cost, 4 GPUs times the frequency of the multi-GPU shapes the
# node could host, kept whole nodes before the kept hosts, their ranks and the hold did; with
# those, it cost allocation on most traces: mixed-b 94.09 -> 95.91 without it, multigpu50
# 97.15 -> 97.19; benchmarks.md, sixteenth session.) With
# ln(U / D) alone 0.05 allocated most; with the model in the kind and the 1 / D part, 0.1
# (0.05 and 0.1 tried, on the default trace and four derived ones).
SCARCE_NODE_GPUS = 0.1
# A GPU of model m taken costs this many GPUs' worth per GPU, times ln(free compute of live
# GPUs / of live GPUs of m), times the frequency of the typical shapes limited to some
# models: a pod that could run anywhere then leaves rare models to the pods that cannot.
# Without pods limited to a model (the default trace) it costs nothing. Chosen from
# 0.05-0.3 (unscaled) on two traces with 30 % of the pods limited to models: 0.1 there moved
# the first 8-GPU refusal from 58-73 % arrived to 85-91 %, with allocation kept.
MODEL_RARITY_GPUS = 0.33
# The rarity is of free compute, not of GPUs: once the common models fill up, a model that
# was rare is no longer, and pods that could run anywhere use it. With rarity by installed
# GPUs they never did on a trace whose pods ask for the common models (mixed-b: 114 nodes
# of 2 T4s untouched at the end while 8-GPU pods were refused). It is recounted when the
# workload is (every ``REFRESH_EVERY`` arrivals, ``view``) and kept unless some model's moved
# by more than this: a change re-scores every class (``byclass``).
RARITY_STEP = 0.01
# The policy's first key (``reserved``): a pod takes from a node that the multi-GPU pods still
# expected need only when no other node fits it, and from the last node of a rare kind only
# when nothing else does either.
NEEDED_RANK = 1.0
LAST_OF_KIND_RANK = 2.0
# ``kept_for_demand`` takes the arrival rate of the pods that need a kind of node this many
# standard errors above its estimate: a shape of rate p seen over n arrivals is known to
# about sqrt(p / n), and a rare shape's decayed rate can sit far below its true one for a
# while. On multigpu50 seed 47 the 120-CPU 8-GPU pods' rate read 0.004-0.007 against 0.0096
# over the trace; 4-GPU pods opened 8 of the 39 nodes of 128 CPUs, their only hosts, and the
# first 8-GPU refusal came at 74 % arrived against best-fit's 92.6. With 1 standard error,
# 75.7; with 2, 87.5; with 3, 92.5 (at some cost in allocation on multigpu50: -0.09 points).
# 2 moved the first refusal later on five of ten traces (earlier by 0.1 on two) and allocation
# by 0.04 points at most (benchmarks.md, sixteenth session).
RATE_MARGIN = 2.0
# When a typical multi-GPU shape's kept hosts (``kept_for_demand``) are down to this many
# untouched nodes or fewer, they are held from narrower pods: one that fits nowhere else is
# refused now (in queue mode it waits) instead of opening one. Holding every kept node cost
# multigpu50 1.1 points of allocation; holding none let a stream of 1-GPU pods open the last
# hosts at 96-97 % arrived on gpuspec10, where best-fit still had room (benchmarks.md,
# fifteenth session). 3 rather than 2 once every pod counted once and the whole-node cost was
# gone: the first 8-GPU refusal later on 13 of 14 traces measured (the same on the last),
# allocation down by 0.07 points at most (sixteenth session). 0 turns holding off.
HELD_WHOLE_NODES = 3
# ``_effective`` counts GPUs stranded for lack of CPU while the cluster's free CPU share is
# at most this far below its free GPU share; past that, CPU binds everywhere and it judges by
# FGD's "one pod fits" (``follow_binding``). Keeping a node's CPU for its own GPUs then only
# moves CPU between GPU pods, and kept back large-CPU pods that use more CPU per GPU. Only
# cpu-heavy 2.5 and cpu300 of fourteen traces get that far at 0.1 or more: 0.12 took them
# from 77.23 to 77.98 allocated (FGD 77.91) and 85.72 to 85.82; 0.05-0.15 gave 77.85-78.03
# on the first; at 0, cpu250 lost 1.1 points; at 0.2 neither moved (benchmarks.md, sixteenth
# session).
CPU_BINDS_MARGIN = 0.12
# For a shape that needs none of a host resource, any node hosts plenty of such pods.
_PLENTY = 1e9
# floor(a * (1/b)) may land just below an exact integer quotient; nudge it up.
_FLOOR_NUDGE = 1e-9


class FragmentationIndex:
    """Per-node usable capacity for each typical shape, for scoring candidate placements."""

    def __init__(
        self,
        *,
        stranding: bool = True,
        keep_whole_nodes: bool = True,
        model_rarity: float = MODEL_RARITY_GPUS,
        held_whole_nodes: int = 0,
    ) -> None:
        # Whether the stranding part of ``_effective`` may count, and whether it does now
        # (``follow_binding``).
        self.may_strand = stranding
        self.stranding = stranding
        # The scarcity cost, the ranks and the hold (FGD has none of them).
        self.keep_whole_nodes = keep_whole_nodes
        self.model_rarity = model_rarity
        self.held_whole_nodes = held_whole_nodes  # ``held_rows``; 0: none held
        self._samples = 0.0  # arrivals the frequencies rest on (``set_workload``)
        # model_rarity x the frequency of model-limited shapes: what a GPU unit of a rare
        # model costs, per unit of ln(live GPUs / live GPUs of the model); 0 turns it off.
        self._rarity_scale = 0.0
        # The fewest GPUs a typical multi-GPU shape asks for (0: none); only nodes with at
        # least as many are reserved (``reserved``).
        self._reserve_gpus = 0
        self.shapes: tuple[Shape, ...] = ()
        self.weights: FloatArray = np.zeros(0)
        self._topology = -1
        self._classes = StateClasses()
        self._classes_topology = -1
        # Bumped whenever scores could change other than through a node's state: new shapes,
        # new weights, a rebuild. Caches of scores by class compare it.
        self.version = 0
        # Untouched nodes by kind: kept whenever the index is current, read by every score.
        self.scarcity = ScarcityTable()
        # ``kept_for_demand`` by kind id, and what it was counted from.
        self._kept: BoolArray = np.zeros(1, np.bool_)
        self._held_for: IntArray = np.zeros(1, np.int64)
        self._kept_key: tuple[int, int, int, int, float] | None = None
        self._empty_state()

    def _empty_state(self) -> None:
        s = len(self.shapes)
        self.s_units = np.zeros(s, np.int64)  # free compute a GPU needs for the shape
        self.s_gpus = np.zeros(s, np.int64)
        self.s_cpu = np.zeros(s, np.int64)
        self.s_mem = np.zeros(s, np.int64)
        self.elig: BoolArray = np.zeros((0, s), np.bool_)
        self.need_mem: IntArray = np.zeros((0, s), np.int64)
        self.limit: IntArray = np.zeros((0, s), np.int64)
        self._uniform_limit: IntArray | None = None
        self._needs_memory = True
        self.s_units_inv = np.ones(s)
        self.s_gpus_inv = np.ones(s)
        self.s_cpu_inv = np.zeros(s)
        self.s_mem_inv = np.zeros(s)
        self.s_cpu_nudge = np.zeros(s)
        self.s_mem_nudge = np.zeros(s)
        self.s_limited = np.zeros(s, np.bool_)  # shapes limited to (or away from) models
        self.model_ok: BoolArray = np.zeros((0, s), np.bool_)  # [model id, shape]
        self.g_rarity: FloatArray = np.zeros(0)  # per GPU slot: ``free_model_rarity``
        self.usable_now: BoolArray = np.zeros((0, s), np.bool_)
        self.pods_now: FloatArray = np.zeros((0, s))
        self.usable: FloatArray = np.zeros((0, s))
        self.pods: FloatArray = np.zeros((0, s))
        self.effective_now: FloatArray = np.zeros((0, s))
        self._stale: set[int] = set()  # node rows whose sums above are out of date

    @property
    def active(self) -> bool:
        return len(self.shapes) > 0

    # -- building ------------------------------------------------------------------------------
    def set_workload(
        self, typical: Sequence[tuple[Shape, float]], state: ClusterState, *, samples: float = 0.0
    ) -> None:
        """``typical``: shapes and frequencies; ``samples``: how many arrivals the frequencies
        rest on (``WorkloadModel.effective_observations``; 0: taken as exact)."""
        self._samples = samples
        self.follow_binding(state)
        shapes = tuple(s for s, _ in typical)
        weights = np.array([w for _, w in typical], dtype=np.float64)
        if self._topology == state.topology_version and self.shapes and shapes != self.shapes:
            self._reshape(shapes, state)
        elif shapes != self.shapes or self._topology != state.topology_version:
            self.shapes = shapes
            self.rebuild(state)
        else:  # a reshape or rebuild counts the rarity with the shape columns
            rarity_moved = self._recount_rarity(state)
            if not rarity_moved and np.array_equal(weights, self.weights):
                return
        self.weights = weights
        self._rarity_scale = self.model_rarity * float(weights[self.s_limited].sum())
        wide = self.s_gpus[(self.s_gpus > 1) & (weights > 0)]
        self._reserve_gpus = int(wide.min()) if len(wide) else 0
        self.version += 1

    def follow_binding(self, state: ClusterState) -> None:
        """Count stranding (when ``may_strand``) unless the cluster's free CPU share is more
        than ``CPU_BINDS_MARGIN`` below its free GPU share. Checked when the workload is
        (every ``REFRESH_EVERY`` arrivals, ``view``): a change re-scores every class."""
        if not self.may_strand:
            return
        live = state.n_live
        cpu_total = float(state.n_cpu_total[live].sum())
        gpu_total = float(state.n_unit_capacity[live].sum())
        if cpu_total <= 0 or gpu_total <= 0:
            return
        cpu_free = float(state.n_cpu_free[live].sum()) / cpu_total
        gpu_free = free_units(state) / gpu_total
        strand = cpu_free + CPU_BINDS_MARGIN >= gpu_free
        if strand == self.stranding:
            return
        self.stranding = strand
        if self.shapes and self._topology == state.topology_version:
            self._refresh(state)
            self.effective_now = self._effective(
                self.usable, self.pods, state.n_cpu_free, state.n_mem_free
            )
            self.version += 1

    def _recount_rarity(self, state: ClusterState) -> bool:
        """``g_rarity`` from the free compute now, when some model's moved by more than
        ``RARITY_STEP``; whether it changed."""
        rarity = free_model_rarity(state)
        if len(rarity) == len(self.g_rarity) and (
            np.abs(rarity - self.g_rarity).max(initial=0.0) <= RARITY_STEP
        ):
            return False
        self.g_rarity = rarity
        return True

    def sync(self, state: ClusterState) -> None:
        if self._topology != state.topology_version:
            self.rebuild(state)

    def _reshape(self, shapes: tuple[Shape, ...], state: ClusterState) -> None:
        """New typical shapes on unchanged nodes: the columns of shapes kept are moved, only
        the new shapes' columns are counted (the typical set changes at its margin, one or two
        shapes at a time, and a full recount is most of a rebuild's cost)."""
        self._refresh(state)
        was = {shape: i for i, shape in enumerate(self.shapes)}
        old = (self.usable_now, self.pods_now, self.usable, self.pods)
        added = tuple(shape for shape in shapes if shape not in was)
        part = FragmentationIndex(stranding=self.stranding)
        part.shapes = added
        if added:
            part._count(state)
        classes, classes_topology = self._classes, self._classes_topology
        self._empty_state()
        self.shapes = shapes
        self._shape_columns(state)
        new_column = {shape: j for j, shape in enumerate(added)}
        merged = [np.empty((a.shape[0], len(shapes)), a.dtype) for a in old]
        for j, shape in enumerate(shapes):
            source = (
                (old, was[shape])
                if shape in was
                else (
                    (part.usable_now, part.pods_now, part.usable, part.pods),
                    new_column[shape],
                )
            )
            for target, array in zip(merged, source[0], strict=True):
                target[:, j] = array[:, source[1]]
        self.usable_now = merged[0].astype(np.bool_, copy=False)
        self.pods_now = merged[1].astype(np.float64, copy=False)
        self.usable = merged[2].astype(np.float64, copy=False)
        self.pods = merged[3].astype(np.float64, copy=False)
        self.effective_now = self._effective(
            self.usable, self.pods, state.n_cpu_free, state.n_mem_free
        )
        self._classes, self._classes_topology = classes, classes_topology
        self.version += 1

    def rebuild(self, state: ClusterState) -> None:
        self._empty_state()
        self.version += 1
        self._topology = state.topology_version
        if not self.shapes:
            return
        self._count(state)
        if self.keep_whole_nodes:
            self.scarcity.rebuild(state)
        if self._classes_topology != state.topology_version:
            self._classes.rebuild(state)
            self._classes_topology = state.topology_version

    def _count(self, state: ClusterState) -> None:
        """Every GPU's and node's usable capacity for ``shapes``, from scratch."""
        self._shape_columns(state)
        self.usable_now, self.pods_now = self.usable_for(
            np.arange(len(state.g_free)), state.g_free, state.g_mem_free, state.g_cont
        )
        self.usable, self.pods = _per_node(state, self.usable_now, self.pods_now)
        self.effective_now = self._effective(
            self.usable, self.pods, state.n_cpu_free, state.n_mem_free
        )

    def _shape_columns(self, state: ClusterState) -> None:
        """What each shape needs, and per GPU slot whether and how it could ever take one."""
        u = state.gpu_units
        exclusive = np.array([s.units >= u for s in self.shapes])
        self.s_units = np.array([u if s.units >= u else max(s.units, 1) for s in self.shapes])
        self.s_gpus = np.array([s.gpus for s in self.shapes], dtype=np.int64)
        self.s_cpu = np.array([s.cpu_milli for s in self.shapes], dtype=np.int64)
        self.s_mem = np.array([s.memory_mib for s in self.shapes], dtype=np.int64)
        self.s_units_inv = 1.0 / self.s_units
        self.s_gpus_inv = 1.0 / np.maximum(self.s_gpus, 1)
        # A shape that needs no CPU (memory) is never limited by it.
        self.s_cpu_inv = np.where(self.s_cpu > 0, 1.0 / np.maximum(self.s_cpu, 1), 0.0)
        self.s_mem_inv = np.where(self.s_mem > 0, 1.0 / np.maximum(self.s_mem, 1), 0.0)
        self.s_cpu_nudge = np.where(self.s_cpu > 0, _FLOOR_NUDGE, _PLENTY)
        self.s_mem_nudge = np.where(self.s_mem > 0, _FLOOR_NUDGE, _PLENTY)
        cards, card_of_slot = np.unique(state.g_mem_total, return_inverse=True)
        need_by_card = np.array(
            [[s.memory.resolve(int(c)) for s in self.shapes] for c in cards], dtype=np.int64
        ).reshape(len(cards), len(self.shapes))
        need = need_by_card[card_of_slot]
        self.need_mem = np.where(exclusive[None, :], state.g_mem_total[:, None], need)
        self.model_ok = np.array(
            [[s.allows_model(m) for s in self.shapes] for m in state.models], dtype=np.bool_
        ).reshape(len(state.models), len(self.shapes))
        # A shape without GPUs (FGD's CPU-only task types) can use no GPU.
        self.elig = (
            (self.s_gpus > 0)[None, :]
            & state.g_live[:, None]
            & self.model_ok[state.g_model]
            & (self.need_mem <= state.g_mem_total[:, None])
        )
        self.s_limited = np.array(
            [bool(s.include_models or s.exclude_models) for s in self.shapes], dtype=np.bool_
        )
        self.g_rarity = free_model_rarity(state)
        self.limit = np.where(exclusive[None, :], 1, state.g_split[:, None])
        splits = np.unique(state.g_split[state.g_live])
        self._uniform_limit = np.where(exclusive, 1, splits[0]) if len(splits) == 1 else None
        self._needs_memory = bool((self.need_mem > 0).any())

    # -- incremental -----------------------------------------------------------------------------
    def update_node(
        self, state: ClusterState, row: int, changed: Iterable[int] | None = None
    ) -> None:
        """Node ``row``'s state changed (only the GPU slots in ``changed``, when given)."""
        if not self.active or self._topology != state.topology_version:
            self._classes_topology = -1  # not kept up to date: rebuilt with the index
            return
        # The node's usable capacity is recounted when a score next reads it (``_refresh``):
        # most decisions are answered from scores cached by class and read none.
        self._stale.add(row)
        self._classes.update_node(state, row, changed)
        if self.keep_whole_nodes:
            self.scarcity.update_row(state, row)

    def _refresh(self, state: ClusterState) -> None:
        """Recount the nodes ``update_node`` marked, all in one pass. Per node it sums whole
        numbers, so summing many nodes at once gives exactly what one node at a time gives."""
        if not self._stale:
            return
        rows = np.array(sorted(self._stale), dtype=np.int64)
        self._stale.clear()
        counts = state.n_count[rows]
        ranges = [
            np.arange(first, first + count, dtype=np.int64)
            for first, count in zip(state.n_first[rows].tolist(), counts.tolist(), strict=True)
        ]
        slots = np.concatenate(ranges)
        free = state.g_free[slots]
        usable, pods = self.usable_for(slots, free, state.g_mem_free[slots], state.g_cont[slots])
        self.usable_now[slots] = usable
        self.pods_now[slots] = pods
        self.usable[rows] = 0.0
        self.pods[rows] = 0.0
        with_gpus = counts > 0
        if with_gpus.any():  # reduceat needs non-empty segments
            starts = (np.cumsum(counts) - counts)[with_gpus]
            self.usable[rows[with_gpus]] = np.add.reduceat(free[:, None] * usable, starts, axis=0)
            self.pods[rows[with_gpus]] = np.add.reduceat(pods, starts, axis=0)
        self.effective_now[rows] = self._effective(
            self.usable[rows], self.pods[rows], state.n_cpu_free[rows], state.n_mem_free[rows]
        )

    def representatives(
        self, state: ClusterState, cands: Candidates, *, same_gpus_per_class: bool = False
    ) -> IntArray | None:
        """The first candidate of each (node class, GPU class) pair, in candidate order: the
        others score and tie exactly like the first of theirs, so choosing among these picks
        the same winner. None when the index is not current.

        Multi-GPU candidates (one per node) are grouped by node class alone, when
        ``same_gpus_per_class``: nodes in one state then take the same GPUs, which holds
        unless the pod names GPUs by UUID."""
        classes = self.current_classes(state)
        if classes is None:
            return None
        if cands.pair_cand is not None:
            if not same_gpus_per_class:
                return None
            first_of_class: IntArray = np.unique(classes.node_ids[cands.rows], return_index=True)[1]
            first_of_class.sort()
            return first_of_class
        key = classes.node_ids[cands.rows] * classes.slot_span + classes.slot_ids[cands.slots]
        n, size = len(key), classes.node_span * classes.slot_span
        if size <= 4 * n + 1024:  # few classes: a lowest-index table beats sorting
            lowest = np.full(size, n, np.int64)
            np.minimum.at(lowest, key, np.arange(n))
            first: IntArray = lowest[lowest < n]
        else:
            first = np.unique(key, return_index=True)[1]
        first.sort()
        return first

    def current_classes(self, state: ClusterState) -> StateClasses | None:
        """The state classes, when the index is active and they are up to date."""
        current = state.topology_version
        if not self.active or self._topology != current or self._classes_topology != current:
            return None
        return self._classes

    def usable_for(
        self,
        slots: IntArray,
        free: IntArray | FloatArray,
        mem_free: IntArray,
        cont: IntArray,
    ) -> tuple[BoolArray, FloatArray]:
        """[slot, shape]: could a pod of each shape take each GPU in this (hypothetical) state,
        and how many such pods the GPU could take (by compute and split count)."""
        # Common cases skip a [slot, shape] gather: one split count for every GPU, and shapes
        # that need no GPU memory (then only over-committed memory blocks a GPU).
        if self._uniform_limit is not None:
            room = self._uniform_limit - cont[:, None]
        else:
            room = self.limit[slots] - cont[:, None]
        usable = self.elig[slots] & (free[:, None] >= self.s_units[None, :]) & (room > 0)
        if self._needs_memory:
            usable &= mem_free[:, None] >= self.need_mem[slots]
        else:
            usable &= (mem_free >= 0)[:, None]
        # floor(free / units) in floats: exact enough with the small nudge, and much faster.
        by_compute = np.floor(free[:, None] * self.s_units_inv + _FLOOR_NUDGE)
        pods: FloatArray = np.minimum(by_compute, room) * usable
        return usable, pods

    def _effective(
        self, usable: FloatArray, pods: FloatArray, cpu: IntArray, mem: IntArray
    ) -> FloatArray:
        """Usable compute per [node, shape] that pods of the shape could really take: all of it
        when the node's free CPU and memory can host as many such pods as its GPUs can, else
        the share that the CPU or memory can feed (FGD only asks whether one pod fits)."""
        gpu_pods = np.floor(pods * self.s_gpus_inv + _FLOOR_NUDGE)
        host_pods = np.minimum(
            np.floor(cpu[:, None] * self.s_cpu_inv + self.s_cpu_nudge),
            np.floor(mem[:, None] * self.s_mem_inv + self.s_mem_nudge),
        )
        if not self.stranding:
            result: FloatArray = usable * ((gpu_pods >= 1) & (host_pods >= 1))
            return result
        np.minimum(host_pods, gpu_pods, out=host_pods)
        np.maximum(host_pods, 0, out=host_pods)
        np.maximum(gpu_pods, 1, out=gpu_pods)
        result = usable * host_pods / gpu_pods
        return result

    # -- scoring ---------------------------------------------------------------------------------
    def loss(
        self,
        state: ClusterState,
        cands: Candidates,
        cpu_milli: int,
        memory_mib: int,
        *,
        distinct: bool = False,
        scarce: bool = True,
    ) -> FloatArray:
        """Usable capacity (weighted by frequency) each candidate would destroy.
        ``distinct``: no two candidates are in the same state (``representatives``).
        ``scarce``: with the cost of opening an untouched node (``scarcity_cost``); without
        it, what is left depends only on the candidate's node and GPU state and the workload,
        so it may be cached by class."""
        rows, pair_cand, slots = cands.rows, cands.pair_cand, cands.slots
        n = len(rows)
        if not self.active or n == 0:
            return np.zeros(n)
        self._refresh(state)
        take_units, take_mem, take_cont = cands.take_units, cands.take_mem, cands.take_cont
        expand: IntArray | None = None
        if pair_cand is None and not distinct:
            # GPUs of one node in the same state score the same: score one of each.
            key = _state_key(state, slots)
            if key is not None:
                _, first, expand = np.unique(key, return_index=True, return_inverse=True)
                rows, slots = rows[first], slots[first]
                take_units, take_mem, take_cont = (
                    take_units[first],
                    take_mem[first],
                    take_cont[first],
                )
        free = state.g_free[slots].astype(np.float64)
        after_free = free - take_units
        after_usable, after_pods = self.usable_for(
            slots, after_free, state.g_mem_free[slots] - take_mem, state.g_cont[slots] + take_cont
        )
        d_usable = after_free[:, None] * after_usable - free[:, None] * self.usable_now[slots]
        d_pods = after_pods - self.pods_now[slots]
        if pair_cand is not None:
            d_usable = _sum_by_candidate(d_usable, pair_cand, n)
            d_pods = _sum_by_candidate(d_pods, pair_cand, n)
        d_usable += self.usable[rows]
        d_pods += self.pods[rows]
        after = self._effective(
            d_usable,
            d_pods,
            state.n_cpu_free[rows] - cpu_milli,
            state.n_mem_free[rows] - memory_mib,
        )
        lost: FloatArray = (self.effective_now[rows] - after) @ self.weights
        if self._rarity_scale > 0:
            rare: FloatArray = self._rarity_scale * take_units * self.g_rarity[slots]
            if pair_cand is not None:
                rare = np.bincount(pair_cand, weights=rare, minlength=n).astype(np.float64)
            lost = lost + rare
        if scarce:
            lost = lost + self.scarcity_cost(state, rows)
        return lost if expand is None else lost[expand.reshape(-1)]

    def node_loss_cpu_only(
        self, state: ClusterState, rows: IntArray, cpu_milli: int, memory_mib: int
    ) -> FloatArray:
        """Usable capacity a GPU-less pod destroys by taking CPU and memory from each node."""
        if not self.active or len(rows) == 0:
            return np.zeros(len(rows))
        self._refresh(state)
        after = self._effective(
            self.usable[rows],
            self.pods[rows],
            state.n_cpu_free[rows] - cpu_milli,
            state.n_mem_free[rows] - memory_mib,
        )
        result: FloatArray = (self.effective_now[rows] - after) @ self.weights
        share = np.maximum(
            cpu_milli / np.maximum(state.n_cpu_free[rows], 1),
            memory_mib / np.maximum(state.n_mem_free[rows], 1),
        )
        return result + self.scarcity_cost(state, rows, share=np.minimum(share, 1.0))

    def reserved(self, state: ClusterState, rows: IntArray, *, takes: bool = True) -> FloatArray:
        """Per row: ``LAST_OF_KIND_RANK`` where the pod would take from one of the last nodes
        of a reserved kind (``scarcity.reserved``) that a typical multi-GPU shape could have
        whole, ``NEEDED_RANK`` where from a node that the multi-GPU pods still expected need
        (``kept_for_demand``), else 0; the first key of the policy, before ``loss``. Without
        multi-GPU shapes no node is kept: what is rare then is judged by the capacity lost
        alone. ``takes``: whether the pod takes anything from the node at all (a pod without
        GPUs asking for no CPU or memory leaves its kind as it is)."""
        if not takes or not self._reserve_gpus or not self.scarce_costs_apply():
            return np.zeros(len(rows))
        wide_enough = state.n_unit_capacity[rows] >= self._reserve_gpus * state.gpu_units
        last = self.scarcity.reserved_rows(rows)
        needed = self.kept_for_demand(state)[self.scarcity.row_kind[rows]]
        result: FloatArray = np.where(last, LAST_OF_KIND_RANK, needed * NEEDED_RANK) * wide_enough
        return result

    def kind_reserved(self, state: ClusterState, kind_id: int) -> float:
        """``reserved`` for an untouched node of kind ``kind_id`` (``ScarcityTable`` id), for
        a pod with GPUs."""
        if not self._reserve_gpus or not self.scarce_costs_apply():
            return 0.0
        capacity = self.scarcity.kinds[kind_id][2]
        if capacity < self._reserve_gpus * state.gpu_units:
            return 0.0
        if self.scarcity.kind_reserved(kind_id):
            return LAST_OF_KIND_RANK
        return NEEDED_RANK if self.kept_for_demand(state)[kind_id] else 0.0

    def kept_for_demand(self, state: ClusterState) -> BoolArray:
        """By ``ScarcityTable`` kind id (one more entry for NOT_UNTOUCHED, never kept): the
        untouched kinds that the typical multi-GPU shapes they can host whole are expected to
        need, every node of them, before the cluster fills; ``reserved`` keeps them from pods
        that fit elsewhere.

        For a multi-GPU shape s, its hosts are the untouched kinds with the CPU, memory, GPUs
        and model it needs. The pods expected to need them are those of the shapes whose hosts
        are among s's (they can go nowhere else), at their arrival rate (the workload's
        frequency) times the arrivals the free GPUs still hold. When s's hosts are no more than
        that expectation plus its square root (one standard deviation, as for Poisson
        arrivals), all of them are kept. On the
        openb multigpu50 variant the 39 nodes of 128 CPUs are the only hosts of the 120-CPU
        8-GPU pods, about 23 of which were still to come with 24 of those nodes untouched; 4-GPU
        pods that would strand a 96-CPU node's other GPUs opened them instead, and the first
        8-GPU pod was refused 1.4 points before best-fit's (benchmarks.md, fourteenth session).
        Recounted when a node enters or leaves the untouched table, or the workload changes."""
        table = self.scarcity
        key = (self.version, table.version, table.changes, len(table.kinds), self._samples)
        if key == self._kept_key:
            return self._kept
        kept = np.zeros(len(table.kinds) + 1, np.bool_)
        # By kind: the GPU count of the widest shape it is held for (``held_rows``), else 0.
        held_for = np.zeros(len(table.kinds) + 1, np.int64)
        self._kept, self._held_for, self._kept_key = kept, held_for, key
        if len(self.weights) != len(self.shapes) or not (self.s_gpus > 1).any():
            return kept
        if self.weights.sum() <= 0:
            return kept
        rate = self.weights / self.weights.sum()
        per_arrival = float((rate * self.s_units * self.s_gpus).sum())
        free = free_units(state)
        arrivals = free / max(per_arrival, 1.0)
        untouched = table.untouched_kinds()
        hosts: dict[int, frozenset[int]] = {}
        for j in np.flatnonzero((self.s_gpus > 1) & (rate > 0)).tolist():
            hosts[j] = frozenset(
                kind_id
                for kind_id in untouched
                if self._hosts_whole(state, j, table.kinds[kind_id])
            )
        for j, kinds in hosts.items():
            if not kinds:
                continue
            needing = sum(float(rate[t]) for t, other in hosts.items() if other <= kinds)
            if self._samples > 0:  # the rate as high as the arrivals seen allow
                needing += RATE_MARGIN * math.sqrt(needing / self._samples)
            expected = arrivals * needing
            left = sum(untouched[k] for k in kinds)
            if left <= expected + math.sqrt(expected):
                kept[list(kinds)] = True
                if left <= self.held_whole_nodes:
                    wide = int(self.s_gpus[j])
                    held_for[list(kinds)] = np.maximum(held_for[list(kinds)], wide)
        return kept

    def held_width(self, gpus: int) -> int:
        """The fewest GPUs of the shapes whose hosts ``held_rows`` holds from a pod of
        ``gpus`` GPUs (0: none)."""
        wider = self._held_for[self._held_for > gpus]
        return int(wider.min()) if len(wider) else 0

    def held_rows(self, state: ClusterState, gpus: int) -> IntArray:
        """Node rows held from a pod of ``gpus`` GPUs in all: for each typical multi-GPU shape
        whose hosts are ``kept_for_demand`` and no more than ``held_whole_nodes`` untouched
        nodes, those nodes, from pods narrower than the shape (a pod as wide is what they are
        kept for). A pod without GPUs is held off them too: its CPU and memory are what the
        multi-GPU pods would need there. Counted per shape: the 2-GPU shapes' many hosts do
        not hide that the 8-GPU pods are down to their last two."""
        none: IntArray = np.zeros(0, np.int64)
        if self.held_whole_nodes <= 0 or not self.active or self._reserve_gpus <= 1:
            return none
        self.kept_for_demand(state)
        held_for = self._held_for
        if not (held_for > gpus).any():
            return none
        # NOT_UNTOUCHED (-1) reads the last entry, which is never set.
        row_kind = self.scarcity.row_kind
        n = min(len(row_kind), len(state.n_live))
        rows: IntArray = np.flatnonzero((held_for[row_kind[:n]] > gpus) & state.n_live[:n])
        return rows

    def _hosts_whole(self, state: ClusterState, shape: int, kind: Kind) -> bool:
        """Whether an untouched node of ``kind`` could host a pod of typical shape ``shape``."""
        cpu, memory, capacity, model = kind
        if cpu < self.s_cpu[shape] or memory < self.s_mem[shape]:
            return False
        if capacity < self.s_gpus[shape] * state.gpu_units:
            return False
        if model < 0:  # a node of mixed models: only for shapes that take any model
            return not bool(self.s_limited[shape])
        return bool(self.model_ok[model, shape])

    def scarce_costs_apply(self) -> bool:
        """Whether scores include ``scarcity_cost``."""
        return self.keep_whole_nodes and len(self.weights) > 0

    def scarce_cost_of_kind(self, state: ClusterState, kind_id: int) -> float:
        """``scarcity_cost`` of an untouched node of this kind (``ScarcityTable`` id)."""
        return SCARCE_NODE_GPUS * state.gpu_units * self.scarcity.cost_of_kind(kind_id)

    def scarcity_cost(
        self, state: ClusterState, rows: IntArray, *, share: FloatArray | None = None
    ) -> FloatArray:
        """Per row: ``SCARCE_NODE_GPUS`` GPUs times its kind's scarcity when untouched
        (``ScarcityTable``), else 0. It does not wait for multi-GPU shapes to be seen: on
        openb, 8-GPU pods of 120 CPUs fit only the 39 nodes of 128 CPUs, and ordinary pods
        (which strand less CPU there) had opened all 39 before the first multi-GPU pod
        arrived (seed 43: first 8-GPU refusal at 5.8 % arrived). It changes whenever a node
        is opened, for every untouched node: scores cached by class leave it out and add it
        when read (``byclass``).

        A pod without GPUs (``share`` given) leaves the node untouched, of a smaller kind:
        it pays the log part, and the 1 / D part in proportion to the share of the node's
        free CPU or memory it takes (a pod of 2 CPUs on the only node of 64 would otherwise
        rather strand a GPU elsewhere). On the CPU-heavy trace the full 1 / D part and this
        share both keep the 8-GPU pods placeable (first refusal at 91.8 % arrived, 10
        seeds; 89.2 % and 89.3 % allocated); the log part alone does not (87.0 %)."""
        if not self.scarce_costs_apply():
            return np.zeros(len(rows))
        costs = self.scarcity.costs(rows)
        if share is not None:  # a pod without GPUs: the node stays untouched, of a smaller kind
            log_part = self.scarcity.costs(rows, opened=False)
            costs = log_part + (costs - log_part) * share
        result: FloatArray = SCARCE_NODE_GPUS * state.gpu_units * costs
        return result


def free_units(state: ClusterState) -> float:
    """Free compute units over the live GPUs (a GPU used past its capacity counts 0)."""
    return float(np.maximum(state.g_free, 0)[state.g_live].sum())


def free_model_rarity(state: ClusterState) -> FloatArray:
    """Per GPU slot: ln(free compute of live GPUs / free compute of live GPUs of its model),
    each at least one unit (a model with nothing free has no candidates to cost)."""
    if not len(state.models):
        return np.zeros(len(state.g_live))
    free = np.maximum(state.g_free, 0) * state.g_live
    per_model = np.bincount(state.g_model, weights=free, minlength=len(state.models))
    rarity = np.log(max(float(per_model.sum()), 1.0) / np.maximum(per_model, 1.0))
    result: FloatArray = rarity[state.g_model]
    return result


def _sum_by_candidate(values: FloatArray, pair_cand: IntArray, n: int) -> FloatArray:
    """Row sums per candidate. Pairs come grouped by candidate (every finder emits them in
    order), so a segmented sum does it; otherwise fall back to the slower scatter-add."""
    starts = np.flatnonzero(np.r_[True, pair_cand[1:] != pair_cand[:-1]])
    if len(starts) == n and (np.diff(pair_cand[starts]) == 1).all() and pair_cand[0] == 0:
        result: FloatArray = np.add.reduceat(values, starts, axis=0)
        return result
    total = np.zeros((n, values.shape[1]))
    np.add.at(total, pair_cand, values)
    return total


def _state_key(state: ClusterState, slots: IntArray) -> IntArray | None:
    """One integer per (node, model, free compute, containers, free memory), or None when the
    ranges are too wide to pack into 63 bits."""
    spans = [
        len(state.n_first),
        len(state.models) or 1,
        state.gpu_units + 1,
        int(state.g_split.max(initial=0)) + 2,
        int(state.g_mem_total.max(initial=0)) + 1,
    ]
    if np.prod(np.array(spans, dtype=np.float64)) >= 2.0**62:
        return None
    free = state.g_free[slots]
    cont = state.g_cont[slots]
    mem = state.g_mem_free[slots]
    if free.min(initial=0) < 0 or cont.min(initial=0) < 0 or mem.min(initial=0) < 0:
        return None  # over-committed GPUs (counted from outside): no packing
    key = state.g_node[slots] * spans[1] + state.g_model[slots]
    key = key * spans[2] + free
    key = key * spans[3] + np.minimum(cont, spans[3] - 1)
    result: IntArray = key * spans[4] + np.minimum(mem, spans[4] - 1)
    return result


def _per_node(
    state: ClusterState, usable: BoolArray, pods: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Sums over each node's consecutive GPU slots: usable free compute and pods that fit."""
    free_usable = state.g_free[:, None] * usable
    zeros = np.zeros((1, usable.shape[1]))
    cum_free = np.concatenate([zeros, np.cumsum(free_usable, axis=0)])
    cum_pods = np.concatenate([zeros, np.cumsum(pods, axis=0)])
    start = state.n_first
    stop = state.n_first + state.n_count
    return cum_free[stop] - cum_free[start], cum_pods[stop] - cum_pods[start]
