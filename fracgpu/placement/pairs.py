"""Which GPU slots are in each (node class, GPU class) pair, kept as nodes change class.

A pair's slots score alike, and ties go to the lowest slot, so a decision needs only the
pairs that exist and the lowest slot of each. Nodes of one class have the same GPU classes
in the same order (``StateClasses`` keys a node class by them), and a node's slots are
consecutive, so a pair's lowest slot is the lowest first slot among the class's nodes plus
where that GPU class first appears in a node of the class. The index therefore keeps, per
node class, a min-heap of its nodes' first slots (a node that leaves is dropped lazily, when
it reaches the top): a node changing class is one heap push, not one per GPU.
"""

import heapq
from collections.abc import Sequence

# (node class id, GPU class id)
Pair = tuple[int, int]


class ClassPairs:
    """The live pairs and, per pair, its lowest GPU slot."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every node's class (after ids were renumbered)."""
        self._class_of: dict[int, int] = {}  # node's first slot -> its node class
        self._heaps: dict[int, list[int]] = {}  # node class -> first slots, stale ones too
        self._sizes: dict[int, int] = {}  # node class -> how many nodes are in it
        # Node class -> GPU class -> offset of its first GPU in a node. An id's GPU classes
        # never change until ``reset``, so this is worked out once per node class.
        self._offsets: dict[int, dict[int, int]] = {}
        self._pairs: list[Pair] | None = None  # the live pairs, until a class comes or goes
        self._count = 0  # how many live pairs, kept as classes come and go (no list built)
        self._entries = 0  # heap entries, stale ones included

    def move_node(self, first: int, node_id: int, slot_ids: Sequence[int]) -> None:
        """The node whose GPUs are slots ``first``, ``first + 1``, ... is now in node class
        ``node_id``, whose GPUs are in the GPU classes ``slot_ids``, in order."""
        if not slot_ids:
            return  # no GPU slots: in no pair (and its first slot is another node's)
        class_of, sizes = self._class_of, self._sizes
        old = class_of.get(first)
        if old == node_id:
            return
        class_of[first] = node_id
        if old is not None:
            left = sizes[old] - 1
            if left:
                sizes[old] = left
            else:  # the class is gone: drop its heap, stale entries and all
                del sizes[old]
                self._entries -= len(self._heaps.pop(old))
                self._pairs = None
                self._count -= len(self._offsets[old])
        heap = self._heaps.get(node_id)
        if heap is None:
            self._heaps[node_id] = [first]
            sizes[node_id] = 1
            self._pairs = None
            if node_id not in self._offsets:
                offsets: dict[int, int] = {}
                for offset, slot_id in enumerate(slot_ids):
                    offsets.setdefault(slot_id, offset)
                self._offsets[node_id] = offsets
            self._count += len(self._offsets[node_id])
        else:
            heapq.heappush(heap, first)
            sizes[node_id] += 1
        self._entries += 1
        # Stale entries of classes that live on pile up; rebuild the heaps now and then.
        if self._entries > 2 * len(class_of) + 64:
            self._rebuild_heaps()

    def pairs(self) -> list[Pair]:
        return list(self._live())

    def __len__(self) -> int:
        return self._count

    def _live(self) -> list[Pair]:
        if self._pairs is None:
            self._pairs = [
                (node_id, slot_id) for node_id in self._sizes for slot_id in self._offsets[node_id]
            ]
        return self._pairs

    def lowest(self, pair: Pair) -> int:
        """The lowest slot in ``pair`` (which must be live)."""
        node_id, slot_id = pair
        heap = self._heaps[node_id]
        class_of = self._class_of
        while class_of[heap[0]] != node_id:
            heapq.heappop(heap)
            self._entries -= 1
        return heap[0] + self._offsets[node_id][slot_id]

    def _rebuild_heaps(self) -> None:
        heaps: dict[int, list[int]] = {}
        for first, node_id in self._class_of.items():
            heaps.setdefault(node_id, []).append(first)
        for heap in heaps.values():
            heapq.heapify(heap)
        self._heaps = heaps
        self._entries = len(self._class_of)
