"""``StateBackend`` over the Kubernetes API: watch caches in, written-behind reservations out.

``KubeState`` composes parts with one job each: the watch caches (watchcache.py), the
leader's claim ledger (ledger.py), pod liveness (liveness.py), the write-behind writer
(writebehind.py), the view sync (viewsync.py) and the leader's self-check of them against
a recount (selfcheck.py). It owns what joins them: who may place
(``Leadership``), reserving, releasing, and the admission window.

Safety across replicas rests on one rule: only the leader (``Leadership``) places. It holds
each claim and quota charge in memory, counted in its view and quotas at once; nothing is
written on the admission's path. A claim is dropped when its pod appears, or written to its
GPUNode's ``status.reservations`` if the pod has not appeared ``write_behind_s`` later;
quota charges reach ``status.used`` through the leader's recount (controllers.py); every
write carries a resourceVersion precondition. Other replicas raise ``ForwardToLeader``. A
successor reads what was written; what a leader that died had not written is covered by the
successor's takeover grace (see leader.py).

A reservation stays until its pod has been visible for ``settle_s`` (longer than any
replica's watch lag); views count each slice once (a live pod's reservation ID is not
counted again).

A pod that a later admission step refuses never appears, and its reservation is given back
within seconds instead of after ``reservation_ttl_s``: fracgpu's validating webhook runs
after every mutating webhook and *confirms* the reservation on the leader (a follower
forwards the review). Unconfirmed ``admission_window_s`` after it was made, the pod was
refused before validation (a later mutating webhook, the API server's own validation):
released; a validation arriving later finds no reservation and denies, so nothing is handed
out twice. Confirmed but not in the pod cache ``admission_window_s`` later (after the other
validating webhooks, whose timeout is at most 30 s, and ResourceQuota): the leader reads the
pod from the API server, and releases the reservation if it is not there.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

import aiohttp

from fracgpu import names
from fracgpu.model import Quota, Reservation
from fracgpu.placement import ClusterView
from webhook.cluster import paths
from webhook.cluster.apiclient import ApiError, KubeApi
from webhook.cluster.leader import Leadership
from webhook.cluster.ledger import ClaimLedger, quota_key
from webhook.cluster.liveness import PodLiveness
from webhook.cluster.records import (
    GPUNodeRecord,
    PodRecord,
    gpunode_record,
    namespace_opted_out,
    node_record,
    pod_record,
    quota_record,
)
from webhook.cluster.selfcheck import LedgerSelfCheck
from webhook.cluster.viewsync import ViewSync
from webhook.cluster.watchcache import WatchCache, WatchSettings
from webhook.cluster.writebehind import WriteBehind
from webhook.rules.tolerations import Taint
from webhook.settings import Settings
from webhook.state.backend import Claim, DriftCounts, ForwardToLeader, RejectKind, ReserveRejected
from webhook.state.reservecheck import reserve_problem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KubeStateSettings:
    # The operator's settings (``from_settings``; their defaults live in webhook.settings).
    split_count: int
    memory_scaling: float
    held_whole_nodes: int
    reservation_ttl_s: int
    # How long a reservation outlives its pod's appearance (covers the replicas' watch lag).
    settle_s: float
    # How long a claim's pod may take to appear before the claim is written to its GPUNode
    # (one write per node carries every such claim of the round).
    write_behind_s: float
    # How long a reservation waits for its confirmation, and a confirmed one for its pod.
    admission_window_s: float
    # How often the leader compares its bookkeeping with a recount (selfcheck.py).
    self_check_s: float
    # Tuning of this module, not operator settings: retries, and the wait after a failed
    # write round.
    write_retries: int = 5
    write_retry_s: float = 1.0
    watch: WatchSettings = field(default_factory=WatchSettings)

    @classmethod
    def from_settings(cls, config: Settings) -> "KubeStateSettings":
        return cls(
            split_count=config.split_count,
            memory_scaling=config.memory_scaling,
            held_whole_nodes=config.held_whole_nodes,
            reservation_ttl_s=config.reservation_ttl_seconds,
            settle_s=config.settle_seconds,
            write_behind_s=config.write_behind_seconds,
            admission_window_s=config.admission_window_seconds,
            self_check_s=config.self_check_interval_seconds,
        )


class KubeState:
    """The cluster as the watch caches see it, plus the leader's claims and their writes."""

    def __init__(
        self,
        api: KubeApi,
        settings: KubeStateSettings,
        clock: Callable[[], float] = time.time,
        leadership: Leadership | None = None,
        find_leader: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        self._api = api
        self.settings = settings
        self._clock = clock
        # Not placing until an elector says so (tests may hand in one that always places).
        self._leadership = leadership or Leadership(clock=clock)
        self._find_leader = find_leader
        watch = settings.watch
        self.pods = WatchCache(api, paths.PODS, pod_record, settings=watch, name="pods")
        self.nodes = WatchCache(api, paths.NODES, node_record, settings=watch, name="nodes")
        self.gpunodes = WatchCache(
            api, paths.GPUNODES, gpunode_record, settings=watch, name="gpunodes"
        )
        self.gpuquotas = WatchCache(
            api, paths.GPUQUOTAS, quota_record, settings=watch, name="gpuquotas"
        )
        self.namespaces = WatchCache(
            api, paths.NAMESPACES, namespace_opted_out, settings=watch, name="namespaces"
        )
        self._caches = (self.pods, self.nodes, self.gpunodes, self.gpuquotas, self.namespaces)
        self.ledger = ClaimLedger()
        self.liveness = PodLiveness(settings.settle_s, clock)
        self.sync = ViewSync(
            pods=self.pods,
            nodes=self.nodes,
            gpunodes=self.gpunodes,
            liveness=self.liveness,
            ledger=self.ledger,
            split_count=settings.split_count,
            memory_scaling=settings.memory_scaling,
            held_whole_nodes=settings.held_whole_nodes,
            clock=clock,
        )
        self.writer = WriteBehind(
            api,
            gpunodes=self.gpunodes,
            gpuquotas=self.gpuquotas,
            ledger=self.ledger,
            liveness=self.liveness,
            write_behind_s=settings.write_behind_s,
            write_retry_s=settings.write_retry_s,
            write_retries=settings.write_retries,
            clock=clock,
        )
        self.self_check = LedgerSelfCheck(
            pods=self.pods,
            gpunodes=self.gpunodes,
            ledger=self.ledger,
            liveness=self.liveness,
            sync=self.sync,
            interval_s=settings.self_check_s,
            clock=clock,
        )
        self._last_forget = 0.0
        self.pods.add_listener(self._on_pod)

    # -- lifecycle -------------------------------------------------------------------------
    async def run(self) -> None:
        """Run every watch cache and the write-behind writer until cancelled."""
        await asyncio.gather(*(cache.run() for cache in self._caches), self.writer.run())

    def ready(self) -> bool:
        return all(cache.synced.is_set() for cache in self._caches)

    # -- StateBackend ------------------------------------------------------------------------
    async def view(self) -> ClusterView:
        return self.sync.view()

    async def namespace_managed(self, namespace: str) -> bool:
        return not self.namespaces.get(namespace)

    async def quotas(self, namespace: str) -> tuple[Quota, ...]:
        """The namespace's GPUQuotas, with the charges this leader has not written yet."""
        with_unwritten = self.ledger.with_unwritten
        return tuple(
            with_unwritten(q) for _, q in self.gpuquotas.items() if q.namespace == namespace
        )

    def all_quotas(self) -> tuple[Quota, ...]:
        """Every GPUQuota in the watch cache, with the charges this leader has not written."""
        return tuple(self.ledger.with_unwritten(q) for _, q in self.gpuquotas.items())

    async def node_labels(self) -> Mapping[str, Mapping[str, str]]:
        return self.sync.node_labels()

    async def node_taints(self) -> Mapping[str, tuple[Taint, ...]]:
        return self.sync.node_taints()

    async def reservation(self, reservation_id: str, node: str = "") -> Reservation | None:
        if self.liveness.is_live(reservation_id):
            # Already carried by a live pod: a second pod presenting it copied it.
            return None
        held = self.ledger.inflight(reservation_id)
        if held is not None:
            return held.claim.reservation  # admitted here, not written yet
        found = self._cached_reservation(reservation_id, node)
        if found is None and node:
            if not self._leadership.leading():
                # The leader may hold it unwritten: only the leader can say.
                await self.check_placing()
            # Written a moment ago (by a predecessor); our watch may not have it yet.
            await self.writer.reload_gpunode(node)
            found = self._cached_reservation(reservation_id, node)
        return found

    def _cached_reservation(self, reservation_id: str, node: str) -> Reservation | None:
        # The pod names its node: look there first, through every GPUNode only on a miss.
        named = self.gpunodes.get(node) if node else None
        found = _find(named, reservation_id)
        if found is None:
            for _, record in self.gpunodes.items():
                found = _find(record, reservation_id)
                if found is not None:
                    break
        return found

    def placing(self) -> bool:
        return self._leadership.placing()

    async def check_placing(self) -> None:
        leadership = self._leadership
        if leadership.placing():
            return
        if leadership.leading():
            raise ForwardToLeader("", leadership.why_not_placing())
        url = leadership.leader_url
        if not url and self._find_leader is not None:
            url = await self._find_leader()  # just started, or the leader just changed
        why = leadership.why_not_placing() + ("" if url else " and no leader is known")
        raise ForwardToLeader(url, why)

    async def reserve(self, claim: Claim) -> None:
        """Hold the claim in memory (the view and the quotas count it at once); only the
        leader reserves, so nothing else can take the slice. A claim whose pod is still not
        live after ``write_behind_s`` is written to its GPUNode; quota charges are written
        by the leader's recount. Nothing is written on the admission's path."""
        await self.check_placing()
        held = replace(
            claim.reservation,
            expires_at=int(self._clock()) + self.settings.reservation_ttl_s,
        )
        claim = replace(claim, reservation=held)
        queued = not held.node  # a queued pod's quota charge: no GPU held yet
        if not queued and self.gpunodes.get(held.node) is None:
            raise ReserveRejected(RejectKind.CAPACITY, f"node {held.node} has no GPUNode")
        quotas = await self.quotas(held.namespace)
        # No await from here until the claim is held: nothing else can take its room.
        rejected = reserve_problem(
            self.sync.view(), claim, quotas, claim.models, split_count=self.settings.split_count
        )
        if rejected is not None:
            raise rejected
        if not queued:
            # Checked after the last await, so no other bind runs in between: a queued entry
            # copied onto a second pod carries the same ID, and one ID places one pod.
            other = self._placed_with(held.id)
            if other and other != f"{held.namespace}/{held.pod}":
                raise ReserveRejected(
                    RejectKind.CAPACITY,
                    f"reservation {held.id} already placed pod {other}: one reservation ID "
                    "places one pod (a copied queued entry)",
                )
        # Counted by the view and by quotas() until the writer or the recount writes it.
        self.ledger.hold(claim, (quota_key(q) for q in quotas), self._clock())
        self.forget_old()
        if not queued:
            self.sync.allocate(claim)
            self.writer.queue_node(held.node)

    def _placed_with(self, reservation_id: str) -> str:
        """The pod (namespace/name) a reservation ID already placed, if any: an in-flight
        claim holding GPUs, or a live pod carrying the ID on a node."""
        held = self.ledger.inflight(reservation_id)
        if held is not None and held.claim.reservation.node:
            placed = held.claim.reservation
            return f"{placed.namespace}/{placed.pod}"
        return self.liveness.carrier(reservation_id) or ""

    async def release(self, reservation_id: str) -> None:
        """Give a reservation back: unwritten parts are dropped, written ones written back."""
        self.ledger.end_window(reservation_id)
        charged = self.ledger.take_charged(reservation_id)
        unwritten = self.ledger.drop(reservation_id)
        if unwritten is not None:
            self.sync.changed(unwritten.claim.reservation.node)
        still_unwritten = self.ledger.forget_unwritten({reservation_id})
        found = self._cached_reservation(reservation_id, "")
        if found is not None:
            await self.writer.remove_reservation(found.node, reservation_id)
        if charged is not None:
            for quota in await self.quotas(charged.reservation.namespace):
                if quota_key(quota) not in still_unwritten:
                    await self.writer.charge_quota(quota, charged, -1)

    async def confirm(self, reservation_id: str, pod: str) -> None:
        if self.liveness.is_live(reservation_id):
            return  # stored already
        if not self._leadership.leading():
            await self.check_placing()  # only the leader holds the window: forward
        self.ledger.confirm(reservation_id, pod, self._clock())

    async def release_refused(self) -> int:
        """Give back the reservations whose pods a later admission step refused (see the
        module's docstring); the leader's controllers call this every round. Returns how
        many were released."""
        due = self._clock() - self.settings.admission_window_s
        refused = self.ledger.unconfirmed_since(due)
        for rid, confirmed in self.ledger.take_confirmed_since(due):
            if not await self._pod_stored(confirmed.namespace, confirmed.pod, rid):
                refused.append(rid)
        for rid in refused:
            log.info("reservation %s released: its pod was refused after fracgpu admitted it", rid)
            await self.release(rid)
        return len(refused)

    async def _pod_stored(self, namespace: str, pod: str, reservation_id: str) -> bool:
        """Whether the API server holds the pod with this reservation: a list without a
        resourceVersion is read from storage (the pod cache may lag), and needs only the
        list permission the pod watch has. Errors count as stored: the TTL still ends it."""
        if not namespace or not pod or pod.endswith("*"):
            return True  # no name to read: leave it to the TTL
        try:
            found = await self._api.list(
                paths.pods_in(namespace), fieldSelector=f"metadata.name={pod}"
            )
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            log.warning("cannot read pod %s/%s: %s", namespace, pod, error)
            return True
        return any(
            (item.get("metadata", {}).get("annotations") or {}).get(names.ANNOTATION_RESERVATION_ID)
            == reservation_id
            for item in found.get("items") or ()
        )

    # -- what the controllers read -------------------------------------------------------------
    def unwritten_claims(self) -> tuple[Claim, ...]:
        """Claims reserved here that still hold capacity and are not yet in their GPUNode."""
        now = self._clock()
        claims = (h.claim for h in self.ledger.inflight_claims())
        return tuple(c for c in claims if self.liveness.holds_capacity(c.reservation, now))

    def departed_reservation_ids(self) -> frozenset[str]:
        """Reservations whose pod has come and gone; forgotten after one TTL."""
        self.forget_old()
        return self.liveness.departed_reservation_ids()

    def forget_old(self) -> None:
        """Drop bookkeeping older than one TTL, at most once per TTL/4 (amortised)."""
        now = self._clock()
        if now - self._last_forget < self.settings.reservation_ttl_s / 4:
            return
        self._last_forget = now
        horizon = now - self.settings.reservation_ttl_s
        self.liveness.forget_departed_before(horizon)
        # Claims that could never be written (their GPUNode went away) stop counting.
        for node in self.ledger.forget_before(horizon, now):
            self.sync.changed(node)

    def drift_counts(self) -> DriftCounts:
        check = self.self_check
        return DriftCounts(check.checks, dict(check.repairs), dict(check.drifted))

    def bookkeeping_sizes(self) -> tuple[int, int]:
        """(departed, charged) entries held now; both stay bounded by one TTL of traffic."""
        return self.liveness.departed_count(), self.ledger.charged_count()

    # -- pod events ---------------------------------------------------------------------------
    def _on_pod(self, key: str, old: PodRecord | None, new: PodRecord | None) -> None:
        if old is None and new is not None and self._takes_over_its_claim(new):
            # The view already counts exactly what the pod holds (its claim): no recount.
            self.sync.summary_changed(new.node)
        else:
            for record in (old, new):
                if record is not None:
                    self.sync.changed(record.node)
        departed = self.liveness.pod_changed(key, old, new)
        if new is not None and not new.terminal and new.node and new.reservation_id:
            # The pod holds the slice now: its window is over, its claim need never be written.
            self.ledger.pod_live(new.reservation_id)
        elif new is not None and not new.terminal and new.reservation_id:
            # A queued pod is stored: it carries its quota charge now (the recount counts it).
            self.ledger.queued_pod_stored(new.reservation_id)
        if departed:
            self.forget_old()

    def _takes_over_its_claim(self, pod: PodRecord) -> bool:
        """Whether a new pod holds what the claim admitted for it holds (node, GPUs, CPU,
        memory) while the view still counts that claim: the usual way a pod appears."""
        held = self.ledger.inflight(pod.reservation_id) if pod.reservation_id else None
        if held is None or pod.terminal:
            return False
        claim = held.claim
        return (
            claim.reservation.node == pod.node
            and claim.reservation.allocations == pod.allocations
            and claim.cpu_milli == pod.cpu_milli
            and claim.memory_mib == pod.memory_mib
            and self.liveness.holds_capacity(claim.reservation, self._clock())
        )


def _find(record: GPUNodeRecord | None, reservation_id: str) -> Reservation | None:
    if record is not None:
        for held in record.reservations:
            if held.id == reservation_id:
                return held
    return None
