"""The leader's writer: claims and quota charges from the ledger to GPUNode and GPUQuota status.

Nothing is written on an admission's path. A claim whose pod has not appeared
``write_behind_s`` after admission is written to its GPUNode, one write per node carrying
every such claim of the round; queued quota charges are written the same way. Every write
carries the resourceVersion it was decided on; one lock per object in this replica queues
writers behind each other (they reuse the previous write's version instead of colliding).
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace

import aiohttp

from fracgpu.codec import decode_quota
from fracgpu.model import Quota, Reservation
from webhook.cluster import paths, stores
from webhook.cluster.apiclient import ApiError, ConflictError, KubeApi, NotFoundError, Obj
from webhook.cluster.ledger import ClaimLedger, quota_key, with_claims
from webhook.cluster.liveness import PodLiveness
from webhook.cluster.records import GPUNodeRecord
from webhook.cluster.watchcache import WatchCache
from webhook.rules import quota as quotalib
from webhook.state.backend import Claim, RejectKind, ReserveRejected

log = logging.getLogger(__name__)
QUOTA_RETRY_FACTOR = 4


class WriteBehind:
    """Writes what the ledger holds, in rounds, guarded by resourceVersion."""

    def __init__(
        self,
        api: KubeApi,
        *,
        gpunodes: WatchCache[GPUNodeRecord],
        gpuquotas: WatchCache[Quota],
        ledger: ClaimLedger,
        liveness: PodLiveness,
        write_behind_s: float,
        write_retry_s: float,
        write_retries: int,
        clock: Callable[[], float],
    ) -> None:
        self._api = api
        self._gpunodes = gpunodes
        self._gpuquotas = gpuquotas
        self._ledger = ledger
        self._liveness = liveness
        self._write_behind_s = write_behind_s
        self._write_retry_s = write_retry_s
        self._write_retries = write_retries
        self._clock = clock
        # What the next round writes.
        self._node_writes: set[str] = set()
        self._quota_writes: set[str] = set()
        self._wake = asyncio.Event()
        self._locks: dict[str, asyncio.Lock] = {}

    def node_lock(self, node: str) -> asyncio.Lock:
        """The lock every writer of GPUNode ``node`` (or ``quota:NS/NAME``) in this replica
        holds, so that writes queue behind each other (and reuse the last write's
        resourceVersion) instead of answering each other with 409 Conflict."""
        return self._locks.setdefault(node, asyncio.Lock())

    def queue_node(self, node: str) -> None:
        """Write the node's claims in a later round."""
        self._node_writes.add(node)
        self._wake.set()

    def queue_quota(self, key: str) -> None:
        """Write the quota's unwritten charges in a later round."""
        self._quota_writes.add(key)
        self._wake.set()

    async def run(self) -> None:
        """Write the claims whose pods are not live ``write_behind_s`` after admission (most
        pods are stored within milliseconds, and their claims are dropped unwritten); one
        GPUNode write carries every such claim of the window. Runs until cancelled."""
        while True:
            await self._wake.wait()
            await asyncio.sleep(self._write_behind_s)
            self._wake.clear()
            if not await self.write_pending():
                await asyncio.sleep(self._write_retry_s)  # the API is struggling

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

    async def flush(self, timeout_s: float) -> bool:
        """Write every claim and quota charge held in memory (a leader handing over); True
        when all is written."""
        deadline = self._clock() + timeout_s
        while self._ledger.unwritten() and self._clock() < deadline:
            self._node_writes.update(self._ledger.inflight_nodes())
            self._quota_writes.update(self._ledger.unwritten_quota_keys())
            if not await self.write_pending(everything=True):
                await asyncio.sleep(self._write_retry_s)
        return not self._ledger.unwritten()

    # -- GPUNode reservations ----------------------------------------------------------------
    async def _write_node(self, node: str, everything: bool) -> bool:
        async with self.node_lock(node):
            return await self._write_claims(node, everything)

    async def _write_claims(self, node: str, everything: bool) -> bool:
        now = self._clock()
        due = now - self._write_behind_s
        on_node = self._ledger.on_node(node)
        claims = [h.claim for h in on_node if everything or h.since <= due]
        if len(claims) < len(on_node):
            self.queue_node(node)  # the younger ones' pods may appear yet
        if not claims:
            return True
        record = self._gpunodes.get(node)
        if record is None:
            # The GPUNode went away, and with it the node from the view: nothing to hold.
            log.warning("GPUNode %s is gone; dropping %d unwritten claims", node, len(claims))
            for claim in claims:
                self._ledger.drop(claim.reservation.id)
            return True
        kept = self.kept(record)
        known = {r.id for r in kept}
        added = [
            c.reservation
            for c in claims
            if c.reservation.id not in known and self._liveness.holds_capacity(c.reservation, now)
        ]
        reservations = (*kept, *added)
        try:
            written = await stores.write_reservations(
                self._api, node, record.resource_version, reservations
            )
        except ConflictError:
            await self.reload_gpunode(node)  # the agent or an old leader wrote it
            self.queue_node(node)
            return True
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            log.warning("writing reservations of %s failed, will retry: %s", node, error)
            self.queue_node(node)
            return False
        for claim in claims:  # now counted from the written record instead
            self._ledger.drop(claim.reservation.id)
        self.store_written(record, written, reservations)
        return True

    async def remove_reservation(self, node: str, reservation_id: str) -> None:
        """Take a written reservation off its GPUNode (it expires if that keeps failing)."""
        async with self.node_lock(node):
            await self._write_removal(node, reservation_id)

    async def _write_removal(self, node: str, reservation_id: str) -> None:
        for _ in range(self._write_retries):
            record = self._gpunodes.get(node)
            if record is None or all(r.id != reservation_id for r in record.reservations):
                return
            keep = tuple(r for r in self.kept(record) if r.id != reservation_id)
            try:
                written = await stores.write_reservations(
                    self._api, node, record.resource_version, keep
                )
            except ConflictError:
                await self.reload_gpunode(node)
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
            self._gpunodes.put(written)
            return
        self._gpunodes.put_record(
            record.name,
            version,
            replace(record, resource_version=version, reservations=reservations),
        )

    def kept(self, record: GPUNodeRecord) -> list[Reservation]:
        """The node's reservations minus the prunable ones: every write drops those on the
        way (the API server's cost of a GPUNode write grows with the list), so the list
        stays short without waiting for the controllers' round."""
        now = self._clock()
        return [r for r in record.reservations if not self._liveness.prunable(r, now)]

    async def reload_gpunode(self, node: str) -> None:
        with contextlib.suppress(NotFoundError):
            self._gpunodes.put(await self._api.get(f"{paths.GPUNODES}/{node}"))

    # -- GPUQuota use -----------------------------------------------------------------------------
    async def _write_quota(self, key: str) -> bool:
        async with self.node_lock(f"quota:{key}"):
            claims = self._ledger.unwritten_for(key)
            quota = self._gpuquotas.get(key)
            if not claims:
                return True
            if quota is None:
                self._ledger.quota_gone(key)
                return True
            try:
                written = await stores.write_quota_used(self._api, with_claims(quota, claims))
            except ConflictError:
                with contextlib.suppress(NotFoundError):
                    self._gpuquotas.put(await self._api.get(paths.gpuquota(*key.split("/", 1))))
                self.queue_quota(key)
                return True
            except (ApiError, aiohttp.ClientError, TimeoutError) as error:
                log.warning("writing the use of GPUQuota %s failed, will retry: %s", key, error)
                self.queue_quota(key)
                return False
            self._gpuquotas.put(written)
            self._ledger.charges_written(key, claims)
            return True

    async def charge_quota(self, quota: Quota, claim: Claim, sign: int) -> Quota:
        """Write one claim's charge (``sign`` -1: its refund) to a quota now."""
        key = quota_key(quota)
        async with self.node_lock(f"quota:{key}"):
            # queued writers start from the newest copy, not the one read before queueing
            quota = self._gpuquotas.get(key) or quota
            return await self._write_quota_charge(quota, claim, sign)

    async def _write_quota_charge(self, quota: Quota, claim: Claim, sign: int) -> Quota:
        allocations = claim.reservation.allocations
        # A conflict here says nothing about room (the recount writes the same object), so
        # retry longer than for GPUNodes.
        attempts = QUOTA_RETRY_FACTOR * self._write_retries
        for _ in range(attempts):
            updated = quotalib.charge(quota, allocations, claim.models, sign)
            try:
                written = await stores.write_quota_used(self._api, updated)
            except ConflictError:
                fresh = await self._api.get(paths.gpuquota(quota.namespace, quota.name))
                self._gpuquotas.put(fresh)
                quota = decode_quota(fresh)
                continue
            self._gpuquotas.put(written)
            return decode_quota(written)
        raise ReserveRejected(
            RejectKind.QUOTA,
            f'GPUQuota "{quota.namespace}/{quota.name}" changed {attempts} times while '
            "charging it; try again",
        )
