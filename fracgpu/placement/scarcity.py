"""How scarce each kind of untouched node is, kept as nodes are opened and freed.

A node is *untouched* when none of its GPUs' compute is in use (its live GPUs' free compute
is all of it); its *kind* is (free CPU, free memory, GPU compute, GPU model). For an
untouched node of kind k, D(k) counts the untouched nodes that could host whatever it could
(the same model, and free CPU, free memory and GPU compute each at least k's; k's own nodes
included) and U all untouched nodes. Its scarcity is ln(U / D(k)) + LAST_FEW x (1 / D(k) -
1 / U): the log ranks kinds by how rare they are among untouched nodes; the second part makes
the last few nodes of a kind dear, as those are what a pod needing that kind whole (all of a
node, or a model few nodes have) waits for. Both are 0 for a kind every untouched node
covers: in a small cluster, or one of alike nodes, opening the commonest kind costs nothing
(with LAST_FEW / D alone, the one untouched node of a two-node cluster cost 6 GPUs to open,
and a pod packed onto the other node's GPU rather than open it).

The model is part of the kind because a pod limited to a model can use no other: before it
was, a node of a rare model counted as covered by the many bigger nodes of other models, and
pods that could run anywhere opened the rare model's nodes first (on a trace with 30 % of
the pods limited to one or two models, the first 8-GPU pod limited to a model with 21 such
nodes was refused with the cluster 18-40 % full).

The last few nodes of a kind (``RESERVED_NODES``) are also *reserved*: whatever the costs,
a pod takes from one only when no other node fits it. That is a rank, not a cost, so scores
keep it apart (``scoring``, ``byclass``).

The table counts untouched nodes per kind and keeps D per kind: a node entering or leaving
the untouched set (or changing kind) moves one count and the D of the kinds it covers,
O(kinds) with a few dozen kinds, instead of regrouping every untouched node. Scores read
``costs`` when they need it; nothing derived from it is cached by node class.
"""

import math

import numpy as np

from fracgpu.placement.state import BoolArray, ClusterState, FloatArray, IntArray

# (free CPU milli, free memory MiB, GPU compute units over live GPUs, model key): the model
# key is the model id when all the node's GPUs are one model, else a negative id per mix.
Kind = tuple[int, int, int, int]
# The weight of 1 / D in a kind's scarcity. With ln(U / D) alone the last node of a kind
# cost little more than the tenth; 20-300 were tried on the default trace and four derived
# ones (3-4 seeds each): 60 kept the most allocation with the 8-GPU pods placeable.
LAST_FEW = 60.0
# A kind that at most this many untouched nodes cover (and not every one) is *reserved*: a
# pod takes from such a node only when no other node fits it (``FragmentationIndex.
# reserved``). The costs above are weighed against capacity lost now and can lose to it;
# on the CPU-heavy 2.5 trace pods that fit elsewhere took the last 128-CPU node, and the
# first 8-GPU pod was refused at 77.7 % arrived against best-fit's 78.6 (10 seeds). With 1,
# 78.6, no seed earlier than best-fit; 2 and 4 gave the same first refusal and less
# allocation (5 seeds). No other trace moved by more than 0.02 points of allocation.
RESERVED_NODES = 1
NOT_UNTOUCHED = -1
# Kind ids no untouched node has any more, kept before the table is renumbered.
MAX_DEAD_KINDS = 256


def kind_of(state: ClusterState, row: int, model: int | None = None) -> Kind | None:
    """Node ``row``'s kind when it is untouched (it has live GPUs, all free), else None;
    ``model``: its ``model_key`` when already known."""
    capacity = int(state.n_unit_capacity[row])
    if capacity <= 0 or not state.n_live[row] or int(state.n_free_units[row]) != capacity:
        return None
    if model is None:
        model = model_key(state, row)
    return (int(state.n_cpu_free[row]), int(state.n_mem_free[row]), capacity, model)


def model_key(state: ClusterState, row: int) -> int:
    """The node's GPU model id when its GPUs are all one model, else a negative number that
    stands for its sorted set of model ids (the same set, the same number)."""
    first = int(state.n_first[row])
    models = np.unique(state.g_model[first : first + int(state.n_count[row])])
    if len(models) == 1:
        return int(models[0])
    return -1 - hash(tuple(models.tolist())) % (1 << 40)


def covers(big: Kind, small: Kind) -> bool:
    """A node of kind ``big`` could host whatever one of kind ``small`` could."""
    return big[3] == small[3] and big[0] >= small[0] and big[1] >= small[1] and big[2] >= small[2]


def scarcity(untouched: int, covering: int, *, opened: bool = True) -> float:
    """The scarcity of a kind that ``covering`` of the ``untouched`` nodes cover; without
    ``opened``, the log part only (a pod without GPUs leaves the node in the table: see
    ``FragmentationIndex.scarcity_cost``)."""
    log_part = math.log(untouched / covering)
    return log_part + LAST_FEW * (1 / covering - 1 / untouched) if opened else log_part


def reserved(untouched: int, covering: int) -> bool:
    """Whether a kind that ``covering`` of the ``untouched`` nodes cover is kept for pods
    that fit nowhere else (``RESERVED_NODES``). A kind every untouched node covers is not:
    as with ``scarcity``, the last node of a small or uniform cluster is nothing rare."""
    return covering <= RESERVED_NODES and covering < untouched


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
        self._row_model: IntArray = np.zeros(rows, np.int64)  # model_key per row
        self._count: dict[int, int] = {}  # kind id -> untouched nodes, kinds with any
        self._covering: dict[int, int] = {}  # kind id -> D, for the same kinds
        self._cost: FloatArray | None = None  # scarcity by kind id, until U or D change
        self._cost_list: list[float] | None = None  # the same as a list
        self._cost_kept: FloatArray | None = None  # the log parts alone
        self._reserved: BoolArray | None = None  # ``reserved`` by kind id, likewise
        self._reserved_list: list[bool] | None = None  # the same as a list
        self.untouched = 0  # U
        # Bumped whenever a node enters or leaves the table (or changes kind): what is derived
        # from the counts (``FragmentationIndex.kept_for_demand``) compares it.
        self.changes = 0

    def rebuild(self, state: ClusterState) -> None:
        """From scratch, over every node (after a topology change): grouped with numpy, not
        row by row, as this runs in the decision after a node joins or leaves."""
        self._reset(len(state.n_first))
        # A node's models change only with the topology: keyed once here, read per update.
        with_gpus = np.flatnonzero(state.n_count > 0)
        self._row_model[with_gpus] = _model_keys(state, with_gpus)
        capacity = state.n_unit_capacity
        rows = np.flatnonzero((capacity > 0) & state.n_live & (state.n_free_units == capacity))
        if not len(rows):
            return
        columns = (
            state.n_cpu_free[rows],
            state.n_mem_free[rows],
            capacity[rows],
            self._row_model[rows],
        )
        kinds, inverse, counts = np.unique(
            np.stack(columns, axis=1), axis=0, return_inverse=True, return_counts=True
        )
        ids = np.array([self._id((c, m, g, o)) for c, m, g, o in kinds.tolist()])
        self.row_kind[rows] = ids[inverse.reshape(-1)]
        same_model = kinds[None, :, 3] == kinds[:, None, 3]
        covered_by = same_model & (kinds[None, :, :3] >= kinds[:, None, :3]).all(axis=2)
        covering = covered_by.astype(np.int64) @ counts
        for kind_id, count, d in zip(ids.tolist(), counts.tolist(), covering.tolist(), strict=True):
            self._count[kind_id] = count
            self._covering[kind_id] = d
        self.untouched = len(rows)

    def update_row(self, state: ClusterState, row: int) -> None:
        """Node ``row``'s state changed: move it between kinds, or in or out of the table."""
        kind = kind_of(state, row, int(self._row_model[row]))
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
        self.changes += 1
        # U changed: every kind's costs did
        self._cost = self._cost_list = self._cost_kept = None
        self._reserved = self._reserved_list = None
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

    def _costs_by_kind(self, *, opened: bool = True) -> FloatArray:
        cost = self._cost if opened else self._cost_kept
        if cost is None:
            cost = np.zeros(len(self.kinds) + 1)  # the last one for NOT_UNTOUCHED
            for kind_id, covering in self._covering.items():
                cost[kind_id] = scarcity(self.untouched, covering, opened=opened)
            if opened:
                self._cost = cost
            else:
                self._cost_kept = cost
        return cost

    def costs(self, rows: IntArray, *, opened: bool = True) -> FloatArray:
        """Per row: its kind's ``scarcity`` when untouched, else 0."""
        result: FloatArray = self._costs_by_kind(opened=opened)[self.row_kind[rows]]
        return result

    def _reserved_by_kind(self) -> BoolArray:
        kept = self._reserved
        if kept is None:
            kept = np.zeros(len(self.kinds) + 1, np.bool_)  # the last one for NOT_UNTOUCHED
            for kind_id, covering in self._covering.items():
                kept[kind_id] = reserved(self.untouched, covering)
            self._reserved = kept
        return kept

    def reserved_rows(self, rows: IntArray) -> BoolArray:
        """Per row: whether it is untouched and its kind is ``reserved``."""
        result: BoolArray = self._reserved_by_kind()[self.row_kind[rows]]
        return result

    def kind_reserved(self, kind_id: int) -> bool:
        """Whether kind id ``kind_id`` is ``reserved`` (NOT_UNTOUCHED is not), read from a
        list, as ``cost_of_kind``."""
        kept = self._reserved_list
        if kept is None:
            kept = self._reserved_list = self._reserved_by_kind().tolist()
        return kept[kind_id]

    def cost_of_kind(self, kind_id: int) -> float:
        """The scarcity of one kind id (NOT_UNTOUCHED costs 0), read from a list: one per
        cached option of every per-class decision, where a numpy scalar costs more."""
        costs = self._cost_list
        if costs is None:
            costs = self._cost_list = self._costs_by_kind().tolist()
        return costs[kind_id]

    def untouched_kinds(self) -> dict[int, int]:
        """Untouched nodes per kind id, for the kinds that have any (read only)."""
        return self._count

    def covering(self) -> dict[Kind, int]:
        """D per kind with untouched nodes (for tests against a recount)."""
        return {self.kinds[k]: d for k, d in self._covering.items()}


def _model_keys(state: ClusterState, rows: IntArray) -> IntArray:
    """``model_key`` of each row, in one pass: nodes whose GPUs are one model (nearly all)
    take the first GPU's model; the others are keyed one by one."""
    mismatch = state.g_model != state.g_model[state.n_first[state.g_node]]
    mixed = np.bincount(state.g_node[mismatch], minlength=len(state.n_first)) > 0
    keys: IntArray = state.g_model[state.n_first[rows]].copy()
    for k in np.flatnonzero(mixed[rows]).tolist():
        keys[k] = model_key(state, int(rows[k]))
    return keys
