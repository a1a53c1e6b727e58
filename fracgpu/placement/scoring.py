"""Choosing one candidate: each policy is an ordered list of keys, smallest wins.

Ties on every key go to the lowest GPU slot / node row, so a decision is deterministic.
A key is computed only for the candidates still tied after the keys before it (usually a
handful of the thousands of GPUs that fit), with the same arithmetic per candidate as over
all of them, so the choice does not depend on how many were evaluated.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fracgpu.placement.api import PodDemand, Policy
from fracgpu.placement.candidates import Candidates
from fracgpu.placement.fragmentation import TIE_TOLERANCE, FragmentationIndex
from fracgpu.placement.state import ClusterState, FloatArray, IntArray

# The scheduler framework's highest node score, to which FGD scales its sigmoid.
FGD_MAX_SCORE = 100
# A key's values for the candidates at the given indices (None: for all of them).
Key = Callable[[IntArray | None], FloatArray]


def choose(
    policy: Policy,
    cands: Candidates,
    state: ClusterState,
    frag: FragmentationIndex,
    demand: PodDemand,
) -> int:
    """Index of the winning candidate (``cands`` must not be empty)."""
    if len(cands.rows) == 1:
        return 0
    keys = PolicyKeys(cands, state, demand)
    chain: list[Key]
    if policy is Policy.BINPACK:
        chain = [keys.node_left] if keys.gpu_less else [keys.node_free_after, keys.gpu_left]
    elif policy is Policy.SPREAD:
        chain = (
            [_negated(keys.node_left)]
            if keys.gpu_less
            else [_negated(keys.node_free_after), _negated(keys.gpu_left)]
        )
    elif policy is Policy.BEST_FIT:
        chain = [keys.node_left, keys.gpu_left]
    elif policy is Policy.FGD:
        return _by_fgd(cands, state, frag, demand, keys)
    else:
        reps = None if keys.gpu_less else _representatives(state, frag, cands, demand)
        if reps is not None and len(reps) < len(cands.rows):
            # Score one candidate per class: the others score and tie exactly like it.
            subset = cands.subset(reps)
            return int(reps[_by_fragmentation(subset, state, frag, demand, distinct=True)])
        return _by_fragmentation(cands, state, frag, demand)
    return lexmin(chain, len(cands.rows))


def _by_fragmentation(
    cands: Candidates,
    state: ClusterState,
    frag: FragmentationIndex,
    demand: PodDemand,
    *,
    distinct: bool = False,
) -> int:
    keys = PolicyKeys(cands, state, demand)
    if keys.gpu_less:
        loss = frag.node_loss_cpu_only(state, cands.rows, demand.cpu_milli, demand.memory_mib)
    else:
        loss = frag.loss(state, cands, demand.cpu_milli, demand.memory_mib, distinct=distinct)
    takes = not keys.gpu_less or demand.cpu_milli > 0 or demand.memory_mib > 0
    reserved = frag.reserved(state, cands.rows, takes=takes)
    # The last nodes of a scarce kind only when nothing else fits; then the least capacity
    # lost. Ties (the same capacity lost) go to the node with the least GPU left, then the
    # GPU left fullest: packing keeps whole nodes free for multi-GPU pods.
    chain: list[Key] = [
        lambda idx: reserved if idx is None else reserved[idx],
        lambda idx: loss if idx is None else loss[idx],
        keys.node_free_after,
        keys.gpu_left,
    ]
    return lexmin(chain, len(cands.rows))


def _representatives(
    state: ClusterState, frag: FragmentationIndex, cands: Candidates, demand: PodDemand
) -> IntArray | None:
    c = demand.constraints
    named = bool(c.include_uuids or c.exclude_uuids)
    return frag.representatives(state, cands, same_gpus_per_class=not named)


def _by_fgd(
    cands: Candidates,
    state: ClusterState,
    frag: FragmentationIndex,
    demand: PodDemand,
    keys: "PolicyKeys",
) -> int:
    """The FGD paper's choice: score = floor(100 x sigmoid(fragmentation decrease / 1 GPU)),
    as its simulator hands scores to the scheduler framework (integers up to MaxNodeScore);
    the highest wins, the first candidate (lowest node, then GPU) on ties.

    ``frag`` is an index without stranding, over FGD's task types (popularity sums to 1): the
    candidate's loss of usable capacity is then the fragmentation it adds plus what it takes."""
    reps = None if keys.gpu_less else _representatives(state, frag, cands, demand)
    scored = cands if reps is None else cands.subset(reps)
    if keys.gpu_less:
        loss = frag.node_loss_cpu_only(state, scored.rows, demand.cpu_milli, demand.memory_mib)
    else:
        loss = frag.loss(
            state, scored, demand.cpu_milli, demand.memory_mib, distinct=reps is not None
        )
    taken = sum(c.cores * c.gpus for c in demand.containers)
    decrease = (taken - loss) / state.gpu_units
    score = np.floor(FGD_MAX_SCORE / (1.0 + np.exp(-decrease)))
    first = int(np.flatnonzero(score == score.max())[0])
    return first if reps is None else int(reps[first])


class PolicyKeys:
    """The policies' keys for a subset of the candidates (indices into ``cands``)."""

    def __init__(self, cands: Candidates, state: ClusterState, demand: PodDemand) -> None:
        self._cands = cands
        self._state = state
        self._demand = demand
        self.gpu_less = not demand.containers
        self._sums: tuple[FloatArray, IntArray] | None = None

    def _left(self, idx: IntArray | None) -> FloatArray:
        """GPU left as a fraction, per (slot, take) pair."""
        c, st = self._cands, self._state
        slots = _at(c.slots, idx)
        left: FloatArray = (st.g_free[slots] - _at(c.take_units, idx)) / st.gpu_units + (
            st.g_mem_free[slots] - _at(c.take_mem, idx)
        ) / np.maximum(st.g_mem_total[slots], 1)
        return left

    def _taken(self, idx: IntArray | None) -> IntArray:
        """Compute taken from live GPUs, per (slot, take) pair."""
        c = self._cands
        taken: IntArray = _at(c.take_units, idx) * self._state.g_live[_at(c.slots, idx)]
        return taken

    def _summed(self) -> tuple[FloatArray, IntArray]:
        """Multi-GPU candidates sum over their GPUs: computed for all of them at once."""
        if self._sums is None:
            c, n = self._cands, len(self._cands.rows)
            assert c.pair_cand is not None
            self._sums = (
                np.bincount(c.pair_cand, weights=self._left(None), minlength=n).astype(np.float64),
                np.bincount(c.pair_cand, weights=self._taken(None), minlength=n).astype(np.int64),
            )
        return self._sums

    def gpu_left(self, idx: IntArray | None) -> FloatArray:
        if self.gpu_less:
            return np.zeros(len(self._cands.rows) if idx is None else len(idx))
        if self._cands.pair_cand is None:
            return self._left(idx)
        summed: FloatArray = _at(self._summed()[0], idx)
        return summed

    def _free_after(self, idx: IntArray | None) -> IntArray:
        c = self._cands
        free: IntArray = self._state.n_free_units[_at(c.rows, idx)]
        if self.gpu_less:
            return free
        if c.pair_cand is None:
            taken = self._taken(idx).astype(np.int64)
        else:
            taken = _at(self._summed()[1], idx)
        result: IntArray = free - taken
        return result

    def node_free_after(self, idx: IntArray | None) -> FloatArray:
        return self._free_after(idx).astype(float)

    def node_left(self, idx: IntArray | None) -> FloatArray:
        """Best-fit's "remaining resources": CPU, memory and GPU left, each as a fraction."""
        st, demand, rows = self._state, self._demand, _at(self._cands.rows, idx)
        left: FloatArray = (
            (st.n_cpu_free[rows] - demand.cpu_milli) / np.maximum(st.n_cpu_total[rows], 1)
            + (st.n_mem_free[rows] - demand.memory_mib) / np.maximum(st.n_mem_total[rows], 1)
            + self._free_after(idx) / np.maximum(st.n_unit_capacity[rows], 1)
        )
        return left


def _at(array: Any, idx: IntArray | None) -> Any:
    return array if idx is None else array[idx]


def _negated(key: Key) -> Key:
    return lambda idx: -key(idx)


def tie_limit(best: float) -> float:
    """The largest value that ties with the smallest, ``best``: float noise below
    ``TIE_TOLERANCE`` (relative, or absolute below 1) is not a difference."""
    return best + TIE_TOLERANCE * max(1.0, abs(best))


def lexmin(keys: Sequence[Key], n: int) -> int:
    """Index of the lexicographically smallest of ``n`` candidates; near-equal floats tie."""
    alive: IntArray | None = None  # every candidate
    for key in keys:
        values = key(alive)
        tied = np.flatnonzero(values <= tie_limit(float(values.min())))
        alive = tied if alive is None else alive[tied]
        if len(alive) == 1:
            break
    return 0 if alive is None else int(alive[0])
