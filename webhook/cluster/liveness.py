"""Which reservations' pods are live, since when, and which came and went.

The pod watch feeds it. From it follow the two rules every part of cluster mode asks:
whether a reservation still holds capacity (``holds_capacity``: the view, the recount, the
writer) and whether it may leave its GPUNode (``prunable``: the controllers and every
reservation write).
"""

from collections.abc import Callable, Iterable

from fracgpu.model import Reservation
from webhook.cluster.records import PodRecord
from webhook.rules import quota as quotalib


class PodLiveness:
    """Live pods by node, and the reservation IDs of live and departed pods."""

    def __init__(self, settle_s: float, clock: Callable[[], float]) -> None:
        self._settle_s = settle_s
        self._clock = clock
        self._pods_by_node: dict[str, set[str]] = {}
        self._live: dict[str, str] = {}  # reservation ID -> pod key
        # Reservation ID -> when this replica first saw its pod live: the settle time runs
        # from there (other replicas' pod caches lag behind the pod's appearance).
        self._live_since: dict[str, float] = {}
        # Reservation IDs whose pod was seen and then deleted or finished -> when
        self._departed: dict[str, float] = {}

    def pod_changed(self, key: str, old: PodRecord | None, new: PodRecord | None) -> bool:
        """Follow one pod event; True when a reservation's pod departed just now."""
        departed = False
        if old is not None:
            self._pods_by_node.get(old.node, set()).discard(key)
            if old.reservation_id:
                self._live.pop(old.reservation_id, None)
                if new is None or new.terminal:
                    self._departed[old.reservation_id] = self._clock()
                    departed = True
        if new is not None and not new.terminal and new.node:
            self._pods_by_node.setdefault(new.node, set()).add(key)
            if new.reservation_id:
                self._live[new.reservation_id] = key
                self._live_since.setdefault(new.reservation_id, self._clock())
        if old is not None and old.reservation_id not in self._live:
            self._live_since.pop(old.reservation_id, None)
        return departed

    def live_pods(self) -> dict[str, str]:
        """Pod key -> node of every pod followed as live."""
        return {key: node for node, keys in self._pods_by_node.items() for key in keys}

    def forget_pod(self, key: str, departed: bool) -> set[str]:
        """Stop following a pod as live (the self-check found the pod cache disagrees);
        ``departed``: its reservation counts as come and gone. The nodes it was on."""
        nodes = {node for node, keys in self._pods_by_node.items() if key in keys}
        for node in nodes:
            self._pods_by_node[node].discard(key)
        for rid in [rid for rid, owner in self._live.items() if owner == key]:
            del self._live[rid]
            self._live_since.pop(rid, None)
            if departed:
                self._departed[rid] = self._clock()
        return nodes

    def pods_on(self, node: str) -> Iterable[str]:
        """Keys of the live pods on ``node``."""
        return self._pods_by_node.get(node, ())

    def is_live(self, reservation_id: str) -> bool:
        return reservation_id in self._live

    def carrier(self, reservation_id: str) -> str | None:
        """The key of the live pod carrying this reservation ID, if any."""
        return self._live.get(reservation_id)

    def live_reservation_ids(self) -> dict[str, str]:
        return dict(self._live)

    def departed_reservation_ids(self) -> frozenset[str]:
        return frozenset(self._departed)

    def forget_departed_before(self, horizon: float) -> None:
        self._departed = {rid: at for rid, at in self._departed.items() if at > horizon}

    def departed_count(self) -> int:
        return len(self._departed)

    def holds_capacity(self, held: Reservation, now: float) -> bool:
        """Whether a reservation still holds capacity: not expired, not yet a live pod, and
        not the reservation of a pod that has already come and gone."""
        return quotalib.reservation_charges(held, now, self._live, self._departed)

    def prunable(self, held: Reservation, now: float) -> bool:
        """Whether a reservation can leave its GPUNode: this replica has seen its pod live for
        the settle time (every replica's pod cache has it by then), its pod came and went, or
        it expired without a pod."""
        if held.id in self._departed:
            return True
        if held.id in self._live:
            return now - self._live_since.get(held.id, now) >= self._settle_s
        return now >= held.expires_at
