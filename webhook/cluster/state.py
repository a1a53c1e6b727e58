"""``ClusterState`` over the Kubernetes API: watch caches in, written-behind reservations out.

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
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import NamedTuple

import aiohttp

from fracgpu import names
from fracgpu.codec import decode_quota
from fracgpu.errors import FracgpuError
from fracgpu.model import GPUAllocation, Quota, Reservation
from fracgpu.placement import ClusterView, Usage
from webhook import quota as quotalib
from webhook.capacity import capacity_problem
from webhook.cluster import paths, stores
from webhook.cluster.apiclient import ApiError, ConflictError, KubeApi, NotFoundError, Obj
from webhook.cluster.leader import Leadership
from webhook.cluster.records import (
    GPUNodeRecord,
    NodeRecord,
    PodRecord,
    gpunode_record,
    namespace_opted_out,
    node_record,
    pod_record,
)
from webhook.cluster.watchcache import WatchCache, WatchSettings
from webhook.state import Claim, ForwardToLeader, RejectKind, ReserveRejected
from webhook.tolerations import Taint

log = logging.getLogger(__name__)
QUOTA_RETRY_FACTOR = 4


@dataclass(frozen=True)
class KubeStateSettings:
    split_count: int = 10
    memory_scaling: float = 1.0
    reservation_ttl_s: int = 60
    settle_s: float = 5.0
    write_retries: int = 5
    # How long a claim's pod may take to appear before the claim is written to its GPUNode
    # (one write per node carries every such claim of the round), and the wait after a
    # failed write round.
    write_behind_s: float = 0.2
    write_retry_s: float = 1.0
    # How long a reservation waits for its confirmation, and a confirmed one for its pod.
    admission_window_s: float = 30.0
    watch: WatchSettings = field(default_factory=WatchSettings)


class _Held(NamedTuple):
    """A claim this leader holds in memory, and when (its clock) it was taken."""

    claim: Claim
    since: float


@dataclass(frozen=True)
class QuotaRecord(Quota):
    """A GPUQuota as the watch cache holds it: ``has_status`` is False for a new one whose
    status.used nobody has written yet (the controllers write it at once)."""

    has_status: bool = True


def quota_record(obj: Obj) -> Quota | None:
    try:
        quota = decode_quota(obj)
    except FracgpuError as error:
        log.warning("ignoring unreadable GPUQuota: %s", error)
        return None
    status = obj.get("status")
    has_status = isinstance(status, dict) and "used" in status
    return QuotaRecord(
        **{f.name: getattr(quota, f.name) for f in fields(quota)}, has_status=has_status
    )


class KubeState:
    """The cluster as the watch caches see it, plus CAS writes of reservations and quota use."""

    def __init__(
        self,
        api: KubeApi,
        settings: KubeStateSettings,
        clock: Callable[[], float] = time.time,
        leadership: Leadership | None = None,
        find_leader: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        self._api = api
        self._settings = settings
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
        self._view = ClusterView(
            (),
            default_split_count=settings.split_count,
            default_memory_scaling=settings.memory_scaling,
        )
        self._pods_by_node: dict[str, set[str]] = {}
        self._live_reservations: dict[str, str] = {}  # reservation ID -> pod key
        # Reservation ID -> when this replica first saw its pod live: the settle time runs
        # from there (other replicas' pod caches lag behind the pod's appearance).
        self._live_since: dict[str, float] = {}
        # Reservation IDs whose pod was seen and then deleted or finished -> when
        self._departed: dict[str, float] = {}
        self._last_forget = 0.0
        self._dirty: set[str] = set()  # nodes to recount in the view
        # Nodes changed since the controllers last summarised; None = all (nothing taken yet).
        self._unsummarised: set[str] | None = None
        # Quota this replica charged, for a refund if admission fails after reserving; kept
        # one TTL (later the recount owns the number). Both maps are bounded by time.
        self._charged: dict[str, tuple[Claim, float]] = {}
        # Claims reserved here and not yet in their GPUNode: counted in the view at once.
        self._inflight: dict[str, _Held] = {}
        # Quota key -> charges not yet in that GPUQuota's status.used: counted by quotas().
        self._unwritten_charges: dict[str, list[Claim]] = {}
        # Reservation ID -> when this leader made it, until validation confirms it; then
        # -> (when confirmed, namespace, pod name) until its pod appears (the window runs).
        self._unconfirmed: dict[str, float] = {}
        self._confirmed: dict[str, tuple[float, str, str]] = {}
        # What the write-behind loop writes next.
        self._node_writes: set[str] = set()
        self._quota_writes: set[str] = set()
        self._wake_writer = asyncio.Event()
        # One writer per GPUNode in this replica: queued writes reuse the previous write's
        # resourceVersion instead of colliding with each other.
        self._node_locks: dict[str, asyncio.Lock] = {}
        self.pods.add_listener(self._on_pod)
        # Labels and taints of the GPU nodes, rebuilt only after a Node changed or a GPUNode
        # came or went (admission reads them on every pod; reservations change GPUNodes often).
        self._labels: dict[str, Mapping[str, str]] | None = None
        self._taints: dict[str, tuple[Taint, ...]] | None = None
        self.nodes.add_listener(self._on_node)
        self.gpunodes.add_listener(self._on_gpunode)

    # -- lifecycle -------------------------------------------------------------------------
    async def run(self) -> None:
        """Run every watch cache and the write-behind loop until cancelled."""
        await asyncio.gather(*(cache.run() for cache in self._caches), self.write_behind())

    def ready(self) -> bool:
        return all(cache.synced.is_set() for cache in self._caches)

    # -- ClusterState ------------------------------------------------------------------------
    async def view(self) -> ClusterView:
        self._refresh()
        return self._view

    async def namespace_managed(self, namespace: str) -> bool:
        return not self.namespaces.get(namespace)

    async def quotas(self, namespace: str) -> tuple[Quota, ...]:
        """The namespace's GPUQuotas, with the charges this leader has not written yet."""
        return tuple(
            self._with_unwritten(q) for _, q in self.gpuquotas.items() if q.namespace == namespace
        )

    def all_quotas(self) -> tuple[Quota, ...]:
        """Every GPUQuota in the watch cache, with the charges this leader has not written."""
        return tuple(self._with_unwritten(q) for _, q in self.gpuquotas.items())

    async def node_labels(self) -> Mapping[str, Mapping[str, str]]:
        if self._labels is None:
            self._labels = {
                name: dict(node.labels)
                for name, node in self.nodes.items()
                if self.gpunodes.get(name) is not None
            }
        return self._labels

    async def node_taints(self) -> Mapping[str, tuple[Taint, ...]]:
        if self._taints is None:
            self._taints = {
                name: node.taints
                for name, node in self.nodes.items()
                if node.taints and self.gpunodes.get(name) is not None
            }
        return self._taints

    async def reservation(self, reservation_id: str, node: str = "") -> Reservation | None:
        if reservation_id in self._live_reservations:
            # Already carried by a live pod: a second pod presenting it copied it.
            return None
        held = self._inflight.get(reservation_id)
        if held is not None:
            return held.claim.reservation  # admitted here, not written yet
        found = self._cached_reservation(reservation_id, node)
        if found is None and node:
            if not self._leadership.leading():
                # The leader may hold it unwritten: only the leader can say.
                await self.check_placing()
            # Written a moment ago (by a predecessor); our watch may not have it yet.
            await self._reload_gpunode(node)
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
            expires_at=int(self._clock()) + self._settings.reservation_ttl_s,
        )
        claim = replace(claim, reservation=held)
        queued = not held.node  # a queued pod's charge: quota only, no GPU held yet
        if not queued and self.gpunodes.get(held.node) is None:
            raise ReserveRejected(RejectKind.CAPACITY, f"node {held.node} has no GPUNode")
        self._refresh()
        problem = (
            ""
            if queued
            else capacity_problem(
                self._view,
                held.node,
                held.allocations,
                cpu_milli=claim.cpu_milli,
                memory_mib=claim.memory_mib,
                split_count=self._settings.split_count,
            )
        )
        if problem:
            raise ReserveRejected(RejectKind.CAPACITY, problem)
        quotas = await self.quotas(held.namespace)
        over = quotalib.check(
            [quotalib.charge(q, claim.replaces, {}, -1) for q in quotas],
            held.allocations,
            claim.models,
        )
        if over is not None:
            raise ReserveRejected(RejectKind.QUOTA, over.message)
        self._hold_inflight(claim)
        # Counted by quotas() until the recount (or a handover's flush) writes it.
        for quota in quotas:
            self._unwritten_charges.setdefault(_quota_key(quota), []).append(claim)
        self._charged[held.id] = (claim, self._clock())
        self._unconfirmed[held.id] = self._clock()
        self._forget_old()
        if not queued:
            self._queue(self._node_writes, held.node)

    async def release(self, reservation_id: str) -> None:
        """Give a reservation back: unwritten parts are dropped, written ones written back."""
        self._unconfirmed.pop(reservation_id, None)
        self._confirmed.pop(reservation_id, None)
        charged = self._charged.pop(reservation_id, None)
        unwritten = self._inflight.pop(reservation_id, None)
        if unwritten is not None:
            self._changed(unwritten.claim.reservation.node)
        still_unwritten = self._forget_unwritten({reservation_id})
        found = self._cached_reservation(reservation_id, "")
        if found is not None:
            await self._remove_reservation(found.node, reservation_id)
        if charged is not None:
            claim = charged[0]
            for quota in await self.quotas(claim.reservation.namespace):
                if _quota_key(quota) not in still_unwritten:
                    await self._charge_quota(quota, claim, -1)

    async def confirm(self, reservation_id: str, pod: str) -> None:
        if reservation_id in self._live_reservations:
            return  # stored already
        if not self._leadership.leading():
            await self.check_placing()  # only the leader holds the window: forward
        if self._unconfirmed.pop(reservation_id, None) is not None:
            namespace = self._namespace_of(reservation_id)
            self._confirmed[reservation_id] = (self._clock(), namespace, pod)

    def _namespace_of(self, reservation_id: str) -> str:
        charged = self._charged.get(reservation_id)
        return charged[0].reservation.namespace if charged is not None else ""

    def awaiting_admission(self) -> tuple[int, int]:
        """(unconfirmed, confirmed) reservations whose pods have not appeared yet."""
        return len(self._unconfirmed), len(self._confirmed)

    async def release_refused(self) -> int:
        """Give back the reservations whose pods a later admission step refused (see the
        module's docstring); the leader's controllers call this every round. Returns how
        many were released."""
        now = self._clock()
        due = now - self._settings.admission_window_s
        refused = [rid for rid, since in self._unconfirmed.items() if since <= due]
        for rid, (since, namespace, pod) in list(self._confirmed.items()):
            if since > due:
                continue
            del self._confirmed[rid]
            if not await self._pod_stored(namespace, pod, rid):
                refused.append(rid)
        for rid in refused:
            self._unconfirmed.pop(rid, None)
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

    # -- reservations ---------------------------------------------------------------------------
    def node_lock(self, node: str) -> asyncio.Lock:
        """The lock every writer of GPUNode ``node`` (or ``quota:NS/NAME``) in this replica
        holds, so that writes queue behind each other (and reuse the last write's
        resourceVersion) instead of answering each other with 409 Conflict."""
        return self._node_locks.setdefault(node, asyncio.Lock())

    async def write_behind(self) -> None:
        """Write the claims whose pods are not live ``write_behind_s`` after admission (most
        pods are stored within milliseconds, and their claims are dropped unwritten); one
        GPUNode write carries every such claim of the window. Runs until cancelled."""
        while True:
            await self._wake_writer.wait()
            await asyncio.sleep(self._settings.write_behind_s)
            self._wake_writer.clear()
            if not await self.write_pending():
                await asyncio.sleep(self._settings.write_retry_s)  # the API is struggling

    async def write_pending(self, everything: bool = False) -> bool:
        """One round of writes for what is queued now: the claims held at least
        ``write_behind_s`` (``everything``: all of them); False when a write failed (it
        stays queued)."""
        nodes, self._node_writes = self._node_writes, set()
        quotas, self._quota_writes = self._quota_writes, set()
        results = await asyncio.gather(
            *(self._write_node(node, everything) for node in sorted(nodes)),
            *(self._write_quota(key) for key in sorted(quotas)),
        )
        return all(results)

    def unwritten(self) -> int:
        """Claims and quota charges held in memory only (0 once everything is written);
        a queued pod's claim holds no GPU, and its pod carries the charge once stored."""
        placed = sum(1 for h in self._inflight.values() if h.claim.reservation.node)
        return placed + sum(len(c) for c in self._unwritten_charges.values())

    async def flush(self, timeout_s: float) -> bool:
        """Write every claim and quota charge held in memory (a leader handing over); True
        when all is written."""
        deadline = self._clock() + timeout_s
        while self.unwritten() and self._clock() < deadline:
            self._node_writes.update(
                h.claim.reservation.node
                for h in self._inflight.values()
                if h.claim.reservation.node
            )
            self._quota_writes.update(k for k, c in self._unwritten_charges.items() if c)
            if not await self.write_pending(everything=True):
                await asyncio.sleep(self._settings.write_retry_s)
        return not self.unwritten()

    async def _write_node(self, node: str, everything: bool) -> bool:
        async with self.node_lock(node):
            return await self._write_claims(node, everything)

    async def _write_claims(self, node: str, everything: bool) -> bool:
        now = self._clock()
        due = now - self._settings.write_behind_s
        on_node = [h for h in self._inflight.values() if h.claim.reservation.node == node]
        claims = [h.claim for h in on_node if everything or h.since <= due]
        if len(claims) < len(on_node):
            self._queue(self._node_writes, node)  # the younger ones' pods may appear yet
        if not claims:
            return True
        record = self.gpunodes.get(node)
        if record is None:
            # The GPUNode went away, and with it the node from the view: nothing to hold.
            log.warning("GPUNode %s is gone; dropping %d unwritten claims", node, len(claims))
            for claim in claims:
                self._inflight.pop(claim.reservation.id, None)
            return True
        kept = self._kept(record)
        known = {r.id for r in kept}
        added = [
            c.reservation
            for c in claims
            if c.reservation.id not in known and self._holds_capacity(c.reservation, now)
        ]
        reservations = (*kept, *added)
        try:
            written = await stores.write_reservations(
                self._api, node, record.resource_version, reservations
            )
        except ConflictError:
            await self._reload_gpunode(node)  # the agent or an old leader wrote it
            self._queue(self._node_writes, node)
            return True
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            log.warning("writing reservations of %s failed, will retry: %s", node, error)
            self._queue(self._node_writes, node)
            return False
        for claim in claims:  # now counted from the written record instead
            self._inflight.pop(claim.reservation.id, None)
        self.store_written(record, written, reservations)
        return True

    def _queue(self, writes: set[str], key: str) -> None:
        """Write ``key`` in a later round (``writes``: the node or the quota queue)."""
        writes.add(key)
        self._wake_writer.set()

    def _hold_inflight(self, claim: Claim) -> None:
        held = claim.reservation
        self._inflight[held.id] = _Held(claim, self._clock())
        if held.node:
            self._view.allocate(held.node, held.allocations, claim.cpu_milli, claim.memory_mib)

    async def _remove_reservation(self, node: str, reservation_id: str) -> None:
        async with self.node_lock(node):
            await self._write_removal(node, reservation_id)

    async def _write_removal(self, node: str, reservation_id: str) -> None:
        for _ in range(self._settings.write_retries):
            record = self.gpunodes.get(node)
            if record is None or all(r.id != reservation_id for r in record.reservations):
                return
            keep = tuple(r for r in self._kept(record) if r.id != reservation_id)
            try:
                written = await stores.write_reservations(
                    self._api, node, record.resource_version, keep
                )
            except ConflictError:
                await self._reload_gpunode(node)
                continue
            self.store_written(record, written, keep)
            return
        log.warning("could not remove reservation %s from %s; it will expire", reservation_id, node)

    def store_written(
        self, record: GPUNodeRecord, written: Obj, reservations: tuple[Reservation, ...]
    ) -> None:
        """Cache the GPUNode that a guarded write of ``reservations`` onto ``record`` made:
        the patch applied to exactly that version, so only the list and the version changed
        (decoding the whole answer again cost more than the rest of the write)."""
        version = str(written.get("metadata", {}).get("resourceVersion", ""))
        if not version:
            self.gpunodes.put(written)
            return
        self.gpunodes.put_record(
            record.name,
            version,
            replace(record, resource_version=version, reservations=reservations),
        )

    def _kept(self, record: GPUNodeRecord) -> list[Reservation]:
        """The node's reservations minus the prunable ones: every write drops those on the
        way (the API server's cost of a GPUNode write grows with the list), so the list
        stays short without waiting for the controllers' round."""
        now = self._clock()
        return [r for r in record.reservations if not self.prunable(r, now)]

    async def _reload_gpunode(self, node: str) -> None:
        with contextlib.suppress(NotFoundError):
            self.gpunodes.put(await self._api.get(f"{paths.GPUNODES}/{node}"))

    # -- quota ----------------------------------------------------------------------------------
    def unwritten_charges(self) -> dict[str, tuple[Claim, ...]]:
        """Quota key -> charges admitted but not yet written to that GPUQuota."""
        return {key: tuple(claims) for key, claims in self._unwritten_charges.items() if claims}

    def charges_written(self, key: str, claims: Iterable[Claim]) -> None:
        """These charges of quota ``key`` are in its written status now (a recount counted
        them, or a charge write carried them)."""
        done = {c.reservation.id for c in claims}
        left = [c for c in self._unwritten_charges.get(key, ()) if c.reservation.id not in done]
        if left:
            self._unwritten_charges[key] = left
        else:
            self._unwritten_charges.pop(key, None)

    def _forget_unwritten(self, reservation_ids: set[str]) -> set[str]:
        """Drop these reservations' unwritten charges; the quota keys they were pending in."""
        found = set()
        for key, claims in list(self._unwritten_charges.items()):
            gone = [c for c in claims if c.reservation.id in reservation_ids]
            if gone:
                found.add(key)
                self.charges_written(key, gone)
        return found

    def _with_unwritten(self, quota: Quota) -> Quota:
        claims = self._unwritten_charges.get(_quota_key(quota))
        if not claims:
            return quota
        return _with_claims(quota, claims)

    async def _write_quota(self, key: str) -> bool:
        async with self.node_lock(f"quota:{key}"):
            claims = tuple(self._unwritten_charges.get(key, ()))
            quota = self.gpuquotas.get(key)
            if not claims:
                return True
            if quota is None:
                self._unwritten_charges.pop(key, None)  # the quota was deleted
                return True
            try:
                written = await stores.write_quota_used(self._api, _with_claims(quota, claims))
            except ConflictError:
                with contextlib.suppress(NotFoundError):
                    self.gpuquotas.put(await self._api.get(paths.gpuquota(*key.split("/", 1))))
                self._queue(self._quota_writes, key)
                return True
            except (ApiError, aiohttp.ClientError, TimeoutError) as error:
                log.warning("writing the use of GPUQuota %s failed, will retry: %s", key, error)
                self._queue(self._quota_writes, key)
                return False
            self.gpuquotas.put(written)
            self.charges_written(key, claims)
            return True

    async def _charge_quota(self, quota: Quota, claim: Claim, sign: int) -> Quota:
        key = _quota_key(quota)
        async with self.node_lock(f"quota:{key}"):
            # queued writers start from the newest copy, not the one read before queueing
            quota = self.gpuquotas.get(key) or quota
            return await self._write_quota_charge(quota, claim, sign)

    async def _write_quota_charge(self, quota: Quota, claim: Claim, sign: int) -> Quota:
        allocations = claim.reservation.allocations
        # A conflict here says nothing about room (the recount writes the same object), so
        # retry longer than for GPUNodes.
        for _ in range(QUOTA_RETRY_FACTOR * self._settings.write_retries):
            updated = quotalib.charge(quota, allocations, claim.models, sign)
            try:
                written = await stores.write_quota_used(self._api, updated)
            except ConflictError:
                fresh = await self._api.get(paths.gpuquota(quota.namespace, quota.name))
                self.gpuquotas.put(fresh)
                quota = decode_quota(fresh)
                continue
            self.gpuquotas.put(written)
            return decode_quota(written)
        raise ReserveRejected(
            RejectKind.QUOTA,
            f'GPUQuota "{quota.namespace}/{quota.name}" changed '
            f"{QUOTA_RETRY_FACTOR * self._settings.write_retries} times while charging it; "
            "try again",
        )

    # -- the view ---------------------------------------------------------------------------------
    def _changed(self, node: str) -> None:
        if not node:
            return  # a queued pod or claim: on no node yet
        self._dirty.add(node)
        if self._unsummarised is not None:
            self._unsummarised.add(node)

    def take_changed_nodes(self) -> set[str] | None:
        """Nodes whose GPUNode, Node or pods changed since the last call (None on the first
        call: every node), so the controllers summarise only those."""
        changed, self._unsummarised = self._unsummarised, set()
        return changed

    def requeue_changed_nodes(self, nodes: Iterable[str]) -> None:
        """Hand back nodes taken but not summarised (the round failed part way)."""
        if self._unsummarised is not None:
            self._unsummarised.update(nodes)

    def _on_node(self, key: str, old: NodeRecord | None, new: NodeRecord | None) -> None:
        self._changed(key)
        self._labels = self._taints = None

    def _on_gpunode(self, key: str, old: GPUNodeRecord | None, new: GPUNodeRecord | None) -> None:
        if old is not None and new is not None and old.counted() == new.counted():
            # Only what the leader publishes changed (its own summary write, one per changed
            # node and controller round): the view would recount the same, so it is not.
            if self._unsummarised is not None:
                self._unsummarised.add(key)
            return
        self._changed(key)
        if old is None or new is None:
            self._labels = self._taints = None

    def _on_pod(self, key: str, old: PodRecord | None, new: PodRecord | None) -> None:
        if old is None and new is not None and self._takes_over_its_claim(new):
            # The view already counts exactly what the pod holds (its claim): no recount.
            if self._unsummarised is not None:
                self._unsummarised.add(new.node)
        else:
            for record in (old, new):
                if record is not None:
                    self._changed(record.node)
        if old is not None:
            self._pods_by_node.get(old.node, set()).discard(key)
            if old.reservation_id:
                self._live_reservations.pop(old.reservation_id, None)
                if new is None or new.terminal:
                    self._departed[old.reservation_id] = self._clock()
                    self._forget_old()
        if new is not None and not new.terminal and not new.node and new.reservation_id:
            self._queued_appeared(new.reservation_id)
        if new is not None and not new.terminal and new.node:
            self._pods_by_node.setdefault(new.node, set()).add(key)
            if new.reservation_id:
                self._unconfirmed.pop(new.reservation_id, None)
                self._confirmed.pop(new.reservation_id, None)
                self._live_reservations[new.reservation_id] = key
                self._live_since.setdefault(new.reservation_id, self._clock())
                # The pod holds the slice now: its claim need never be written.
                self._inflight.pop(new.reservation_id, None)
        if old is not None and old.reservation_id not in self._live_reservations:
            self._live_since.pop(old.reservation_id, None)

    def _queued_appeared(self, reservation_id: str) -> None:
        """A queued pod is stored: it carries its quota charge now (the recount counts it);
        its admission claim, which held no GPU, need not be kept or written."""
        held = self._inflight.get(reservation_id)
        if held is not None and not held.claim.reservation.node:
            del self._inflight[reservation_id]
            self._unconfirmed.pop(reservation_id, None)
            self._confirmed.pop(reservation_id, None)

    def _takes_over_its_claim(self, pod: PodRecord) -> bool:
        """Whether a new pod holds what the claim admitted for it holds (node, GPUs, CPU,
        memory) while the view still counts that claim: the usual way a pod appears."""
        held = self._inflight.get(pod.reservation_id) if pod.reservation_id else None
        if held is None or pod.terminal:
            return False
        claim = held.claim
        return (
            claim.reservation.node == pod.node
            and claim.reservation.allocations == pod.allocations
            and claim.cpu_milli == pod.cpu_milli
            and claim.memory_mib == pod.memory_mib
            and self._holds_capacity(claim.reservation, self._clock())
        )

    def unwritten_claims(self) -> tuple[Claim, ...]:
        """Claims reserved here that still hold capacity and are not yet in their GPUNode."""
        now = self._clock()
        claims = (h.claim for h in self._inflight.values())
        return tuple(c for c in claims if self._holds_capacity(c.reservation, now))

    def live_reservation_ids(self) -> dict[str, str]:
        return dict(self._live_reservations)

    def departed_reservation_ids(self) -> frozenset[str]:
        """Reservations whose pod has come and gone; forgotten after one TTL."""
        self._forget_old()
        return frozenset(self._departed)

    def _forget_old(self) -> None:
        """Drop bookkeeping older than one TTL, at most once per TTL/4 (amortised)."""
        now = self._clock()
        if now - self._last_forget < self._settings.reservation_ttl_s / 4:
            return
        self._last_forget = now
        horizon = now - self._settings.reservation_ttl_s
        self._departed = {rid: at for rid, at in self._departed.items() if at > horizon}
        self._charged = {rid: c for rid, c in self._charged.items() if c[1] > horizon}
        # Claims that could never be written (their GPUNode went away) stop counting.
        for rid, held in list(self._inflight.items()):
            if held.claim.reservation.expires_at <= now:
                del self._inflight[rid]
                self._changed(held.claim.reservation.node)

    def bookkeeping_sizes(self) -> tuple[int, int]:
        """(departed, charged) entries held now; both stay bounded by one TTL of traffic."""
        return len(self._departed), len(self._charged)

    def _refresh(self) -> None:
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        now = self._clock()
        for name in dirty:
            record = self.gpunodes.get(name)
            node = self.nodes.get(name)
            if record is None or record.unschedulable or node is None:
                # No Node of that name (deleted, renamed, not registered yet): a pod pinned
                # there would stay Pending forever. The Node's arrival recounts it (_on_node).
                self._view.remove_node(name)
                continue
            inventory = record.inventory(node)
            if self._view.inventory(name) != inventory:
                # A new node or a changed inventory is a topology change; anything else (the
                # usual case: a pod or reservation came or went) only recounts the node.
                self._view.remove_node(name)
                self._view.add_node(inventory)
            self._view.set_usage(name, self._usage_on(name, record, now))

    def _usage_on(self, name: str, record: GPUNodeRecord, now: float) -> Iterator[Usage]:
        """What holds capacity on a node: live pods, open reservations, claims in flight."""
        for key in self._pods_by_node.get(name, ()):
            pod = self.pods.get(key)
            if pod is None or pod.terminal:
                continue
            yield pod.allocations, pod.cpu_milli, pod.memory_mib
        recorded = set()
        for held in record.reservations:
            recorded.add(held.id)
            if self._holds_capacity(held, now):
                yield held.allocations, 0, 0
        for unwritten in self._inflight.values():
            claim = unwritten.claim
            held = claim.reservation
            if held.node == name and held.id not in recorded and self._holds_capacity(held, now):
                yield held.allocations, claim.cpu_milli, claim.memory_mib

    def _holds_capacity(self, held: Reservation, now: float) -> bool:
        """Whether a reservation still holds capacity: not expired, not yet a live pod, and
        not the reservation of a pod that has already come and gone."""
        return quotalib.reservation_charges(held, now, self._live_reservations, self._departed)

    def prunable(self, held: Reservation, now: float) -> bool:
        """Whether a reservation can leave its GPUNode: this replica has seen its pod live for
        the settle time (every replica's pod cache has it by then), its pod came and went, or
        it expired without a pod. The controllers and every reservation write apply this
        same rule."""
        if held.id in self._departed:
            return True
        if held.id in self._live_reservations:
            return now - self._live_since.get(held.id, now) >= self._settings.settle_s
        return now >= held.expires_at

    def node(self, name: str) -> NodeRecord | None:
        return self.nodes.get(name)


def _find(record: GPUNodeRecord | None, reservation_id: str) -> Reservation | None:
    if record is not None:
        for held in record.reservations:
            if held.id == reservation_id:
                return held
    return None


def _quota_key(quota: Quota) -> str:
    return f"{quota.namespace}/{quota.name}"


def _with_claims(quota: Quota, claims: Sequence[Claim]) -> Quota:
    """The quota with these claims charged, and what each replaces (a queued pod's charge,
    when the pod is placed) given back."""
    allocations, models = _charged_together(claims)
    quota = quotalib.charge(quota, allocations, models)
    credit = [a for claim in claims for a in claim.replaces]
    return quotalib.charge(quota, credit, {}, -1) if credit else quota


def _charged_together(claims: Sequence[Claim]) -> tuple[list[GPUAllocation], dict[str, str]]:
    """The allocations and GPU models of several claims, to charge them in one step."""
    allocations: list[GPUAllocation] = []
    models: dict[str, str] = {}
    for claim in claims:
        allocations.extend(claim.reservation.allocations)
        models.update(claim.models)
    return allocations, models
