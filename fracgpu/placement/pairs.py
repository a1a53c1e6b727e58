"""Which GPU slots are in each (node class, GPU class) pair, kept as slots change class.

A pair's slots score alike, and ties go to the lowest slot, so a decision needs only the
pairs that exist and the lowest slot of each. Each pair keeps a min-heap of its slots; a
slot that leaves a pair is dropped from that heap lazily, when it reaches the top.
"""

import heapq
from collections.abc import Sequence

# (node class id, GPU class id)
Pair = tuple[int, int]


class ClassPairs:
    """The live pairs and, per pair, its lowest GPU slot."""

    def __init__(self) -> None:
        self._pair_of: list[Pair | None] = []
        self._heaps: dict[Pair, list[int]] = {}
        self._sizes: dict[Pair, int] = {}
        self._entries = 0  # heap entries, stale ones included

    def reset(self, slots: int) -> None:
        """Forget every slot's pair; ``slots`` slots, none in a pair yet."""
        self._pair_of = [None] * slots
        self._heaps, self._sizes, self._entries = {}, {}, 0

    def move(self, slot: int, pair: Pair) -> None:
        """Slot ``slot`` is now in ``pair``."""
        self.move_node(slot, pair[0], (pair[1],))

    def move_node(self, first: int, node_id: int, slot_ids: Sequence[int]) -> None:
        """Slots ``first``, ``first + 1``, ... (one node's) are now in (``node_id``, each of
        ``slot_ids``): one call per node, as a node's GPUs change class together."""
        pair_of, sizes, heaps = self._pair_of, self._sizes, self._heaps
        for slot, slot_id in enumerate(slot_ids, first):
            pair = (node_id, slot_id)
            old = pair_of[slot]
            if old == pair:
                continue
            pair_of[slot] = pair
            if old is not None:
                left = sizes[old] - 1
                if left:
                    sizes[old] = left
                else:  # the pair is gone: drop its heap, stale entries and all
                    del sizes[old]
                    self._entries -= len(heaps.pop(old))
            heap = heaps.get(pair)
            if heap is None:
                heaps[pair] = [slot]
                sizes[pair] = 1
            else:
                heapq.heappush(heap, slot)
                sizes[pair] += 1
            self._entries += 1
        # Stale entries of pairs that live on pile up; rebuild the heaps now and then.
        if self._entries > 2 * len(pair_of) + 64:
            self._rebuild_heaps()

    def pairs(self) -> list[Pair]:
        return list(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)

    def lowest(self, pair: Pair) -> int:
        """The lowest slot in ``pair`` (which must be live)."""
        heap = self._heaps[pair]
        pair_of = self._pair_of
        while pair_of[heap[0]] != pair:
            heapq.heappop(heap)
            self._entries -= 1
        return heap[0]

    def _rebuild_heaps(self) -> None:
        heaps: dict[Pair, list[int]] = {}
        for slot, pair in enumerate(self._pair_of):
            if pair is not None:
                heaps.setdefault(pair, []).append(slot)  # ascending: already a heap
        self._heaps = heaps
        self._entries = sum(self._sizes.values())
