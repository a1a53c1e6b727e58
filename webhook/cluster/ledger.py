"""The leader's claim ledger: what it admitted and holds in memory, not yet in the API.

- claims in flight: reserved here, counted in the view at once, and dropped when their pod
  appears or written to their GPUNode by the write-behind writer (writebehind.py);
- quota charges not yet in their GPUQuota's ``status.used`` (counted by ``with_unwritten``
  until the recount or a charge write carries them);
- what each reservation charged, for a refund if admission fails after reserving;
- the admission window: a reservation waits for its confirmation by fracgpu's validating
  webhook, and a confirmed one for its pod (see kubestate.py).

Pure bookkeeping: no I/O, no clock of its own (callers pass ``now``).
"""

from collections.abc import Iterable, Sequence, ValuesView
from typing import NamedTuple

from fracgpu.model import GPUAllocation, Quota
from webhook.rules import quota as quotalib
from webhook.state.backend import Claim


class Held(NamedTuple):
    """A claim this leader holds in memory, and when (its clock) it was taken."""

    claim: Claim
    since: float


class Confirmed(NamedTuple):
    """A reservation fracgpu's validation confirmed, waiting for its pod to appear."""

    since: float
    namespace: str
    pod: str


def quota_key(quota: Quota) -> str:
    return f"{quota.namespace}/{quota.name}"


class ClaimLedger:
    """Claims, unwritten quota charges and admission windows this leader holds in memory."""

    def __init__(self) -> None:
        # Claims reserved here and not yet in their GPUNode: counted in the view at once.
        self._inflight: dict[str, Held] = {}
        # Quota key -> charges not yet in that GPUQuota's status.used.
        self._unwritten_charges: dict[str, list[Claim]] = {}
        # Reservation ID -> (claim, when) of what it charged, for a refund if admission fails
        # after reserving; kept one TTL (later the recount owns the number).
        self._charged: dict[str, tuple[Claim, float]] = {}
        # Reservation ID -> when this leader made it, until validation confirms it; then
        # -> Confirmed until its pod appears (the admission window runs).
        self._unconfirmed: dict[str, float] = {}
        self._confirmed: dict[str, Confirmed] = {}

    # -- claims in flight ----------------------------------------------------------------------
    def hold(self, claim: Claim, quota_keys: Iterable[str], now: float) -> None:
        """Record a reserved claim: in flight, charged to ``quota_keys`` (unwritten), and
        waiting for its confirmation."""
        rid = claim.reservation.id
        self._inflight[rid] = Held(claim, now)
        for key in quota_keys:
            self._unwritten_charges.setdefault(key, []).append(claim)
        self._charged[rid] = (claim, now)
        self._unconfirmed[rid] = now

    def inflight(self, reservation_id: str) -> Held | None:
        return self._inflight.get(reservation_id)

    def inflight_claims(self) -> ValuesView[Held]:
        """Every claim in flight (a live view: do not change the ledger while iterating)."""
        return self._inflight.values()

    def inflight_nodes(self) -> set[str]:
        """Nodes of claims in flight (a queued pod's claim holds no GPU: on no node)."""
        return {h.claim.reservation.node for h in self._inflight.values()} - {""}

    def on_node(self, node: str) -> list[Held]:
        return [h for h in self._inflight.values() if h.claim.reservation.node == node]

    def drop(self, reservation_id: str) -> Held | None:
        """Stop holding a claim (its pod holds it now, it was written, or it was released)."""
        return self._inflight.pop(reservation_id, None)

    def pod_live(self, reservation_id: str) -> None:
        """The reservation's pod is live: its window is over and its claim need never be
        written (the pod holds the slice now)."""
        self._unconfirmed.pop(reservation_id, None)
        self._confirmed.pop(reservation_id, None)
        self._inflight.pop(reservation_id, None)

    def queued_pod_stored(self, reservation_id: str) -> None:
        """A queued pod is stored: it carries its quota charge itself (the recount counts
        it), so its admission claim, which held no GPU, is neither kept nor written."""
        held = self._inflight.get(reservation_id)
        if held is not None and not held.claim.reservation.node:
            self.pod_live(reservation_id)

    # -- quota charges --------------------------------------------------------------------------
    def unwritten_charges(self) -> dict[str, tuple[Claim, ...]]:
        """Quota key -> charges admitted but not yet written to that GPUQuota."""
        return {key: tuple(claims) for key, claims in self._unwritten_charges.items() if claims}

    def unwritten_for(self, key: str) -> tuple[Claim, ...]:
        return tuple(self._unwritten_charges.get(key, ()))

    def unwritten_quota_keys(self) -> set[str]:
        return {key for key, claims in self._unwritten_charges.items() if claims}

    def charges_written(self, key: str, claims: Iterable[Claim]) -> None:
        """These charges of quota ``key`` are in its written status now (a recount counted
        them, or a charge write carried them)."""
        done = {c.reservation.id for c in claims}
        left = [c for c in self._unwritten_charges.get(key, ()) if c.reservation.id not in done]
        if left:
            self._unwritten_charges[key] = left
        else:
            self._unwritten_charges.pop(key, None)

    def quota_gone(self, key: str) -> None:
        """The quota was deleted: its unwritten charges have nowhere to go."""
        self._unwritten_charges.pop(key, None)

    def forget_unwritten(self, reservation_ids: set[str]) -> set[str]:
        """Drop these reservations' unwritten charges; the quota keys they were pending in."""
        found = set()
        for key, claims in list(self._unwritten_charges.items()):
            gone = [c for c in claims if c.reservation.id in reservation_ids]
            if gone:
                found.add(key)
                self.charges_written(key, gone)
        return found

    def with_unwritten(self, quota: Quota) -> Quota:
        """The quota with the charges this leader has not written to it yet."""
        claims = self._unwritten_charges.get(quota_key(quota))
        if not claims:
            return quota
        return with_claims(quota, claims)

    def take_charged(self, reservation_id: str) -> Claim | None:
        """The claim a reservation charged (to refund it), forgetting it."""
        charged = self._charged.pop(reservation_id, None)
        return charged[0] if charged is not None else None

    # -- the admission window ---------------------------------------------------------------
    def confirm(self, reservation_id: str, pod: str, now: float) -> None:
        """Validation confirmed the reservation: its pod's window starts (unknown IDs are
        ignored). A later confirmation moves the window to its name: a 1.31+ API server
        whose generated name was taken chooses another and validates again."""
        if (
            self._unconfirmed.pop(reservation_id, None) is not None
            or reservation_id in self._confirmed
        ):
            charged = self._charged.get(reservation_id)
            namespace = charged[0].reservation.namespace if charged is not None else ""
            self._confirmed[reservation_id] = Confirmed(now, namespace, pod)

    def unconfirmed_since(self, due: float) -> list[str]:
        """Reservations made at or before ``due`` and still not confirmed."""
        return [rid for rid, since in self._unconfirmed.items() if since <= due]

    def take_confirmed_since(self, due: float) -> list[tuple[str, Confirmed]]:
        """Reservations confirmed at or before ``due`` whose pod has not appeared, taken out
        of the window (the caller checks whether their pods were stored)."""
        taken = [(rid, c) for rid, c in self._confirmed.items() if c.since <= due]
        for rid, _ in taken:
            del self._confirmed[rid]
        return taken

    def in_window(self) -> set[str]:
        """Reservations whose admission window is open (confirmed or not)."""
        return self._unconfirmed.keys() | self._confirmed.keys()

    def end_window(self, reservation_id: str) -> None:
        self._unconfirmed.pop(reservation_id, None)
        self._confirmed.pop(reservation_id, None)

    def awaiting_admission(self) -> tuple[int, int]:
        """(unconfirmed, confirmed) reservations whose pods have not appeared yet."""
        return len(self._unconfirmed), len(self._confirmed)

    # -- bounded by time ----------------------------------------------------------------------
    def forget_before(self, horizon: float, now: float) -> set[str]:
        """Drop refund records older than ``horizon`` and claims expired by ``now`` (their
        GPUNode went away, so they could never be written); the nodes of dropped claims."""
        self._charged = {rid: c for rid, c in self._charged.items() if c[1] > horizon}
        nodes = set()
        for rid, held in list(self._inflight.items()):
            if held.claim.reservation.expires_at <= now:
                del self._inflight[rid]
                nodes.add(held.claim.reservation.node)
        return nodes

    def charged_count(self) -> int:
        return len(self._charged)

    def unwritten(self) -> int:
        """Claims and quota charges held in memory only (0 once everything is written); a
        queued pod's claim holds no GPU and is never written (its pod carries the charge)."""
        placed = sum(1 for h in self._inflight.values() if h.claim.reservation.node)
        return placed + sum(len(c) for c in self._unwritten_charges.values())


def with_claims(quota: Quota, claims: Sequence[Claim]) -> Quota:
    """The quota with these claims charged, and the queued charges they replace (queued
    pods being placed) given back."""
    allocations, models = charged_together(claims)
    quota = quotalib.charge(quota, allocations, models)
    credit = [a for claim in claims for a in claim.replaces]
    return quotalib.charge(quota, credit, {}, -1) if credit else quota


def charged_together(claims: Sequence[Claim]) -> tuple[list[GPUAllocation], dict[str, str]]:
    """The allocations and GPU models of several claims, to charge them in one step."""
    allocations: list[GPUAllocation] = []
    models: dict[str, str] = {}
    for claim in claims:
        allocations.extend(claim.reservation.allocations)
        models.update(claim.models)
    return allocations, models
