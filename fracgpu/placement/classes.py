"""Equivalence classes of GPUs and nodes by their raw state, kept as the state changes.

Two GPUs are in one class when everything scoring reads from a GPU is equal (model, free
compute, containers, free and total memory, split count, usable at all); two nodes when their
free CPU and memory are equal and their GPUs are in the same classes, in order. Scoring a
candidate reads only its GPU and its node, so candidates of one (node class, GPU class) pair
score alike and one of them stands for all (``FragmentationIndex.representatives``).
Classes depend on state only, not on the workload, so they survive workload changes.
``pairs`` tracks which slots each (node class, GPU class) pair holds, and ``slot_features`` /
``node_features`` give back what an id stands for, so a decision can go pair by pair.
"""

from collections.abc import Iterable

import numpy as np

from fracgpu.placement.pairs import ClassPairs
from fracgpu.placement.state import ClusterState, IntArray

# A GPU class: model id, free compute, containers, free memory, total memory, split count,
# usable at all (1/0); a node class: free CPU, free memory, then its GPUs' class ids.
SlotFeatures = tuple[int, ...]
NodeFeatures = tuple[int, ...]


class StateClasses:
    """A small integer class id per GPU slot and per node row."""

    def __init__(self) -> None:
        self.slot_ids: IntArray = np.zeros(0, np.int64)
        self.node_ids: IntArray = np.zeros(0, np.int64)
        self._slot_table: dict[SlotFeatures, int] = {}
        self._node_table: dict[NodeFeatures, int] = {}
        self.slot_features: list[SlotFeatures] = []  # by GPU class id
        self.node_features: list[NodeFeatures] = []  # by node class id
        self.pairs = ClassPairs()
        # Bumped whenever ids are renumbered: whatever was keyed by ids is stale then.
        self.version = 0

    @property
    def slot_span(self) -> int:
        """One more than the largest GPU class id."""
        return len(self._slot_table) + 1

    @property
    def node_span(self) -> int:
        """One more than the largest node class id."""
        return len(self._node_table) + 1

    def rebuild(self, state: ClusterState) -> None:
        """Classes of every GPU and node from scratch (after a topology change)."""
        self._slot_table, self._node_table = {}, {}
        self.slot_features, self.node_features = [], []
        self.version += 1
        self.slot_ids = np.zeros(len(state.g_free), np.int64)
        self.node_ids = np.zeros(len(state.n_first), np.int64)
        self.pairs.reset()
        ids = self._set_slots(state, 0, len(state.g_free))
        for row, (first, count) in enumerate(
            zip(state.n_first.tolist(), state.n_count.tolist(), strict=True)
        ):
            self._set_node(state, row, first, ids[first : first + count])

    def update_node(
        self, state: ClusterState, row: int, changed: Iterable[int] | None = None
    ) -> None:
        """Re-class one node and its GPUs after their state changed: the GPU slots in
        ``changed`` (all of the node's when None; the others keep their class)."""
        s = state.slots_of_row(row)
        if changed is None:
            ids = self._set_slots(state, s.start, s.stop)
        else:
            ids = self.slot_ids[s.start : s.stop].tolist()
            for slot in changed:
                ids[slot - s.start] = class_id = self._slot_class(_slot_features(state, slot))
                self.slot_ids[slot] = class_id
        self._set_node(state, row, s.start, ids)
        # Ids of states no GPU or node has any more pile up; renumber now and then.
        if (
            len(self._slot_table) + len(self._node_table)
            > 2 * (len(self.slot_ids) + len(self.node_ids)) + 64
        ):
            self.rebuild(state)

    def _set_slots(self, state: ClusterState, start: int, stop: int) -> list[int]:
        """Class the slots ``start:stop``; returns their ids. Reads slices as lists: a node's
        handful of GPUs costs less that way than through 2-D arrays."""
        features = zip(
            state.g_model[start:stop].tolist(),
            state.g_free[start:stop].tolist(),
            state.g_cont[start:stop].tolist(),
            state.g_mem_free[start:stop].tolist(),
            state.g_mem_total[start:stop].tolist(),
            state.g_split[start:stop].tolist(),
            state.g_live[start:stop].tolist(),  # bools: equal and hash equal to 1 / 0
            strict=True,
        )
        ids = [self._slot_class(key) for key in features]
        self.slot_ids[start:stop] = ids
        return ids

    def _slot_class(self, features: SlotFeatures) -> int:
        table = self._slot_table
        class_id = table.setdefault(features, len(table))
        if class_id == len(self.slot_features):
            self.slot_features.append(features)
        return class_id

    def _set_node(self, state: ClusterState, row: int, first: int, slot_ids: list[int]) -> None:
        """Class node ``row``, whose GPUs from slot ``first`` on have ``slot_ids``."""
        key = (int(state.n_cpu_free[row]), int(state.n_mem_free[row]), *slot_ids)
        node_id = self._node_table.setdefault(key, len(self._node_table))
        if node_id == len(self.node_features):
            self.node_features.append(key)
        self.node_ids[row] = node_id
        self.pairs.move_node(first, node_id, slot_ids)


def _slot_features(state: ClusterState, slot: int) -> SlotFeatures:
    """One slot's features, as ``StateClasses._set_slots`` reads them for many (the same
    arrays in the same order). Read one by one, not through a shared list of the arrays:
    this runs on every allocation, and the shared list cost 3 % of an admission."""
    return (
        int(state.g_model[slot]),
        int(state.g_free[slot]),
        int(state.g_cont[slot]),
        int(state.g_mem_free[slot]),
        int(state.g_mem_total[slot]),
        int(state.g_split[slot]),
        bool(state.g_live[slot]),
    )
