"""Choosing one candidate: each policy is an ordered list of keys, smallest wins.

Ties on every key go to the lowest GPU slot / node row, so a decision is deterministic.
"""

from collections.abc import Sequence

import numpy as np

from fracgpu.placement.api import PodDemand, Policy
from fracgpu.placement.candidates import Candidates
from fracgpu.placement.fragmentation import TIE_TOLERANCE, FragmentationIndex
from fracgpu.placement.state import ClusterState, FloatArray, IntArray


def choose(
    policy: Policy,
    cands: Candidates,
    state: ClusterState,
    frag: FragmentationIndex,
    demand: PodDemand,
) -> int:
    """Index of the winning candidate (``cands`` must not be empty)."""
    rows = cands.rows
    n = len(rows)
    u = state.gpu_units
    free = state.g_free[cands.slots]
    gpu_left_pairs: FloatArray = (free - cands.take_units) / u + (
        state.g_mem_free[cands.slots] - cands.take_mem
    ) / np.maximum(state.g_mem_total[cands.slots], 1)
    taken_pairs = cands.take_units * state.g_live[cands.slots]
    gpu_less = not demand.containers
    if gpu_less:
        gpu_left: FloatArray = np.zeros(n)
        taken: IntArray = np.zeros(n, np.int64)
    elif cands.pair_cand is None:
        gpu_left = gpu_left_pairs
        taken = taken_pairs.astype(np.int64)
    else:
        gpu_left = np.bincount(cands.pair_cand, weights=gpu_left_pairs, minlength=n).astype(
            np.float64
        )
        taken = np.bincount(cands.pair_cand, weights=taken_pairs, minlength=n).astype(np.int64)
    node_free_after = state.n_free_units[rows] - taken
    if n == 1:
        return 0

    def node_left() -> FloatArray:
        # Best-fit's "remaining resources": CPU, memory and GPU left, each as a fraction.
        return (
            (state.n_cpu_free[rows] - demand.cpu_milli) / np.maximum(state.n_cpu_total[rows], 1)
            + (state.n_mem_free[rows] - demand.memory_mib) / np.maximum(state.n_mem_total[rows], 1)
            + node_free_after / np.maximum(state.n_unit_capacity[rows], 1)
        )

    keys: list[FloatArray]
    if policy is Policy.BINPACK:
        keys = [node_left()] if gpu_less else [node_free_after.astype(float), gpu_left]
    elif policy is Policy.SPREAD:
        keys = [-node_left()] if gpu_less else [-node_free_after.astype(float), -gpu_left]
    elif policy is Policy.BEST_FIT:
        keys = [node_left(), gpu_left]
    else:
        if gpu_less:
            loss = frag.node_loss_cpu_only(state, rows, demand.cpu_milli, demand.memory_mib)
        else:
            loss = frag.loss(state, cands, demand.cpu_milli, demand.memory_mib)
        # Ties (the same capacity lost) go to the node with the least GPU left, then the GPU
        # left fullest: packing keeps whole nodes free for multi-GPU pods.
        keys = [loss, node_free_after.astype(float), gpu_left]
    return lexmin(keys)


def lexmin(keys: Sequence[FloatArray]) -> int:
    """Index of the lexicographically smallest row; near-equal floats count as ties."""
    alive = np.arange(len(keys[0]))
    for key in keys:
        values = key[alive]
        best = values.min()
        alive = alive[values <= best + TIE_TOLERANCE * max(1.0, abs(float(best)))]
        if len(alive) == 1:
            break
    return int(alive[0])
