"""How scarce each kind of untouched node is, kept as nodes are opened and freed.

A node is *untouched* when none of its GPUs' compute is in use (its live GPUs' free compute
is all of it); its *kind* is (free CPU, free memory, GPU compute). For an untouched node of
kind k, D(k) counts the untouched nodes that could host whatever it could (all three at
least k's, k's own nodes included) and U all untouched nodes; its scarcity is ln(U / D(k)):
0 for the smallest common kind, most for the one kind able to hold the largest whole-node
pods.

The table counts untouched nodes per kind and keeps D per kind: a node entering or leaving
the untouched set (or changing kind) moves one count and the D of the kinds it covers,
O(kinds) with a few dozen kinds, instead of regrouping every untouched node. Scores read
``costs`` when they need it; nothing derived from it is cached by node class.
"""

import math

import numpy as np

from fracgpu.placement.state import ClusterState, FloatArray, IntArray

# (free CPU milli, free memory MiB, GPU compute units over live GPUs)
Kind = tuple[int, int, int]
NOT_UNTOUCHED = -1
# Kind ids no untouched node has any more, kept before the table is renumbered.
MAX_DEAD_KINDS = 256


def kind_of(state: ClusterState, row: int) -> Kind | None:
    """Node ``row``'s kind when it is untouched (it has live GPUs, all free), else None."""
    capacity = int(state.n_unit_capacity[row])
    if capacity <= 0 or not state.n_live[row] or int(state.n_free_units[row]) != capacity:
        return None
    return (int(state.n_cpu_free[row]), int(state.n_mem_free[row]), capacity)


def covers(big: Kind, small: Kind) -> bool:
    """A node of kind ``big`` could host whatever one of kind ``small`` could."""
    return big[0] >= small[0] and big[1] >= small[1] and big[2] >= small[2]


class ScarcityTable:
    """Untouched nodes per kind, and per kind how many untouched nodes cover it."""

    def __init__(self) -> None:
        # Bumped whenever kind ids are renumbered: whatever was keyed by them is stale then.
        self.version = 0
        self._reset(0)

    def _reset(self, rows: int) -> None:
        self.version += 1
        self._id_of: dict[Kind, int] = {}
        self.kinds: list[Kind] = []  # by kind id; ids are not reused until a rebuild
        self.row_kind: IntArray = np.full(rows, NOT_UNTOUCHED, np.int64)
        self._count: dict[int, int] = {}  # kind id -> untouched nodes, kinds with any
        self._covering: dict[int, int] = {}  # kind id -> D, for the same kinds
        self._cost: FloatArray | None = None  # ln(U / D) by kind id, until U or D change
        self._cost_list: list[float] | None = None  # the same as a list
        self.untouched = 0  # U

    def rebuild(self, state: ClusterState) -> None:
        """From scratch, over every node (after a topology change): grouped with numpy, not
        row by row, as this runs in the decision after a node joins or leaves."""
        self._reset(len(state.n_first))
        capacity = state.n_unit_capacity
        rows = np.flatnonzero((capacity > 0) & state.n_live & (state.n_free_units == capacity))
        if not len(rows):
            return
        columns = (state.n_cpu_free[rows], state.n_mem_free[rows], capacity[rows])
        kinds, inverse, counts = np.unique(
            np.stack(columns, axis=1), axis=0, return_inverse=True, return_counts=True
        )
        ids = np.array([self._id((int(c), int(m), int(g))) for c, m, g in kinds.tolist()])
        self.row_kind[rows] = ids[inverse.reshape(-1)]
        covered_by = (kinds[None, :, :] >= kinds[:, None, :]).all(axis=2)  # [kind, by kind]
        covering = covered_by.astype(np.int64) @ counts
        for kind_id, count, d in zip(ids.tolist(), counts.tolist(), covering.tolist(), strict=True):
            self._count[kind_id] = count
            self._covering[kind_id] = d
        self.untouched = len(rows)

    def update_row(self, state: ClusterState, row: int) -> None:
        """Node ``row``'s state changed: move it between kinds, or in or out of the table."""
        kind = kind_of(state, row)
        new = NOT_UNTOUCHED if kind is None else self._id(kind)
        old = int(self.row_kind[row])
        if new == old:
            return
        self.row_kind[row] = new
        if old != NOT_UNTOUCHED:
            self._move(old, -1)
        if new != NOT_UNTOUCHED:
            self._move(new, 1)
        # Ids of kinds no node has any more pile up (CPU-only pods make a new kind of every
        # CPU amount they leave on an untouched node); renumber now and then.
        if len(self.kinds) > MAX_DEAD_KINDS + 2 * len(self._count):
            self.rebuild(state)

    def _id(self, kind: Kind) -> int:
        found = self._id_of.get(kind)
        if found is None:
            found = self._id_of[kind] = len(self.kinds)
            self.kinds.append(kind)
        return found

    def _move(self, kind_id: int, delta: int) -> None:
        self._cost = self._cost_list = None  # U changed, so every ln(U / D) did
        self.untouched += delta
        kind = self.kinds[kind_id]
        if kind_id not in self._count:  # new to the table: count the nodes that cover it
            self._count[kind_id] = 0
            self._covering[kind_id] = sum(
                n for other, n in self._count.items() if covers(self.kinds[other], kind)
            )
        self._count[kind_id] += delta
        for other in self._count:  # its own kind included: it covers itself
            if covers(kind, self.kinds[other]):
                self._covering[other] += delta
        if self._count[kind_id] == 0:
            del self._count[kind_id], self._covering[kind_id]

    def _costs_by_kind(self) -> FloatArray:
        cost = self._cost
        if cost is None:
            cost = self._cost = np.zeros(len(self.kinds) + 1)  # the last one for NOT_UNTOUCHED
            for kind_id, covering in self._covering.items():
                cost[kind_id] = math.log(self.untouched / covering)
        return cost

    def costs(self, rows: IntArray) -> FloatArray:
        """Per row: its kind's scarcity ln(U / D) when untouched, else 0."""
        result: FloatArray = self._costs_by_kind()[self.row_kind[rows]]
        return result

    def cost_of_kind(self, kind_id: int) -> float:
        """The scarcity of one kind id (NOT_UNTOUCHED costs 0), read from a list: one per
        cached option of every per-class decision, where a numpy scalar costs more."""
        costs = self._cost_list
        if costs is None:
            costs = self._cost_list = self._costs_by_kind().tolist()
        return costs[kind_id]

    def covering(self) -> dict[Kind, int]:
        """D per kind with untouched nodes (for tests against a recount)."""
        return {self.kinds[k]: d for k, d in self._covering.items()}
