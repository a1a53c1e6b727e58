"""Expected fragmentation of each node for the workload's typical shapes, kept incrementally.

For a typical shape s, a GPU's free compute is *usable* when a pod of shape s could take
that GPU (model allowed, enough free compute and memory, below the split count; whole-GPU
shapes need a completely free GPU), and the node itself could host the pod (free CPU and
memory, and enough usable GPUs). All other free compute on the node is fragmented for s.
A node's fragmentation is the frequency-weighted sum over shapes:

    frag(n) = sum_s w_s * (free(n) - ok_s(n) * usable_s(n))

Placing a pod changes only its node, so the policy scores a candidate by how much usable
capacity it destroys: sum_s w_s * (ok_s * usable_s before - ok_s * usable_s after). The
per-node sums ``usable`` and ``count`` are arrays [node, shape], updated per changed node.
"""

from collections.abc import Sequence

import numpy as np

from fracgpu.placement.candidates import Candidates
from fracgpu.placement.state import BoolArray, ClusterState, FloatArray, IntArray
from fracgpu.placement.workload import Shape

# Float noise below this (in units x frequency) is not a difference between candidates.
TIE_TOLERANCE = 1e-7


class FragmentationIndex:
    """Per-node usable capacity for each typical shape, for scoring candidate placements."""

    def __init__(self) -> None:
        self.shapes: tuple[Shape, ...] = ()
        self.weights: FloatArray = np.zeros(0)
        self._topology = -1
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
        self.usable_now: BoolArray = np.zeros((0, s), np.bool_)
        self.usable: IntArray = np.zeros((0, s), np.int64)
        self.count: IntArray = np.zeros((0, s), np.int64)

    @property
    def active(self) -> bool:
        return len(self.shapes) > 0

    # -- building ------------------------------------------------------------------------------
    def set_workload(self, typical: Sequence[tuple[Shape, float]], state: ClusterState) -> None:
        shapes = tuple(s for s, _ in typical)
        weights = np.array([w for _, w in typical], dtype=np.float64)
        if shapes != self.shapes or self._topology != state.topology_version:
            self.shapes = shapes
            self.rebuild(state)
        self.weights = weights

    def sync(self, state: ClusterState) -> None:
        if self._topology != state.topology_version:
            self.rebuild(state)

    def rebuild(self, state: ClusterState) -> None:
        self._empty_state()
        self._topology = state.topology_version
        if not self.shapes:
            return
        u = state.gpu_units
        exclusive = np.array([s.units >= u for s in self.shapes])
        self.s_units = np.array([u if s.units >= u else max(s.units, 1) for s in self.shapes])
        self.s_gpus = np.array([s.gpus for s in self.shapes], dtype=np.int64)
        self.s_cpu = np.array([s.cpu_milli for s in self.shapes], dtype=np.int64)
        self.s_mem = np.array([s.memory_mib for s in self.shapes], dtype=np.int64)
        cards, card_of_slot = np.unique(state.g_mem_total, return_inverse=True)
        need_by_card = np.array(
            [[s.memory.resolve(int(c)) for s in self.shapes] for c in cards], dtype=np.int64
        ).reshape(len(cards), len(self.shapes))
        need = need_by_card[card_of_slot]
        self.need_mem = np.where(exclusive[None, :], state.g_mem_total[:, None], need)
        model_ok = np.array(
            [[s.allows_model(m) for s in self.shapes] for m in state.models], dtype=np.bool_
        ).reshape(len(state.models), len(self.shapes))
        self.elig = (
            state.g_live[:, None]
            & model_ok[state.g_model]
            & (self.need_mem <= state.g_mem_total[:, None])
        )
        self.limit = np.where(exclusive[None, :], 1, state.g_split[:, None])
        self.usable_now = self.usable_for(
            np.arange(len(state.g_free)), state.g_free, state.g_mem_free, state.g_cont
        )
        self.usable, self.count = _per_node(state, self.usable_now)

    # -- incremental -----------------------------------------------------------------------------
    def update_node(self, state: ClusterState, row: int) -> None:
        if not self.active or self._topology != state.topology_version:
            return
        s = state.slots_of_row(row)
        slots = np.arange(s.start, s.stop)
        usable = self.usable_for(
            slots, state.g_free[slots], state.g_mem_free[slots], state.g_cont[slots]
        )
        self.usable_now[slots] = usable
        self.usable[row] = (state.g_free[slots, None] * usable).sum(axis=0)
        self.count[row] = usable.sum(axis=0)

    def usable_for(
        self, slots: IntArray, free: IntArray, mem_free: IntArray, cont: IntArray
    ) -> BoolArray:
        """[slot, shape]: could a pod of each shape take each GPU in this (hypothetical) state."""
        return (
            self.elig[slots]
            & (free[:, None] >= self.s_units[None, :])
            & (mem_free[:, None] >= self.need_mem[slots])
            & (cont[:, None] < self.limit[slots])
        )

    # -- scoring ---------------------------------------------------------------------------------
    def loss(
        self, state: ClusterState, cands: Candidates, cpu_milli: int, memory_mib: int
    ) -> FloatArray:
        """Usable capacity (weighted by frequency) each candidate would destroy."""
        rows, pair_cand, slots = cands.rows, cands.pair_cand, cands.slots
        take_units, take_mem, take_cont = cands.take_units, cands.take_mem, cands.take_cont
        n = len(rows)
        if not self.active or n == 0:
            return np.zeros(n)
        before_usable = self.usable[rows]
        before_count = self.count[rows]
        free = state.g_free[slots]
        after_free = free - take_units
        after = self.usable_for(
            slots, after_free, state.g_mem_free[slots] - take_mem, state.g_cont[slots] + take_cont
        )
        was = self.usable_now[slots]
        d_usable = after_free[:, None] * after - free[:, None] * was
        d_count = after.astype(np.int64) - was
        if pair_cand is not None:
            agg_u = np.zeros((n, len(self.shapes)), np.int64)
            agg_c = np.zeros((n, len(self.shapes)), np.int64)
            np.add.at(agg_u, pair_cand, d_usable)
            np.add.at(agg_c, pair_cand, d_count)
            d_usable, d_count = agg_u, agg_c
        cpu = state.n_cpu_free[rows][:, None]
        mem = state.n_mem_free[rows][:, None]
        ok_before = (cpu >= self.s_cpu) & (mem >= self.s_mem) & (before_count >= self.s_gpus)
        after_count = before_count + d_count
        ok_after = (
            (cpu - cpu_milli >= self.s_cpu)
            & (mem - memory_mib >= self.s_mem)
            & (after_count >= self.s_gpus)
        )
        lost = before_usable * ok_before - (before_usable + d_usable) * ok_after
        result: FloatArray = lost @ self.weights
        return result

    def node_loss_cpu_only(
        self, state: ClusterState, rows: IntArray, cpu_milli: int, memory_mib: int
    ) -> FloatArray:
        """Usable capacity a GPU-less pod destroys by taking CPU and memory from each node."""
        if not self.active or len(rows) == 0:
            return np.zeros(len(rows))
        cpu = state.n_cpu_free[rows][:, None]
        mem = state.n_mem_free[rows][:, None]
        fits_gpus = self.count[rows] >= self.s_gpus
        ok_before = (cpu >= self.s_cpu) & (mem >= self.s_mem) & fits_gpus
        ok_after = (cpu - cpu_milli >= self.s_cpu) & (mem - memory_mib >= self.s_mem) & fits_gpus
        lost = self.usable[rows] * (ok_before & ~ok_after)
        result: FloatArray = lost @ self.weights
        return result


def _per_node(state: ClusterState, usable: BoolArray) -> tuple[IntArray, IntArray]:
    """Sums over each node's consecutive GPU slots: usable free compute and usable GPU count."""
    free_usable = state.g_free[:, None] * usable
    zeros = np.zeros((1, usable.shape[1]), np.int64)
    cum_free = np.concatenate([zeros, np.cumsum(free_usable, axis=0)])
    cum_count = np.concatenate([zeros, np.cumsum(usable, axis=0, dtype=np.int64)])
    start = state.n_first
    stop = state.n_first + state.n_count
    return cum_free[stop] - cum_free[start], cum_count[stop] - cum_count[start]
