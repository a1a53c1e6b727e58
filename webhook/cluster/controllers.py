"""Controllers that keep shared state true; one replica runs them (see leader.py).

- give back the reservations of pods that a later admission step refused (kubestate.py);
- prune reservations: drop those whose pod has been live for ``settle_s`` (the pod now
  accounts for the slice), whose pod was deleted or finished, or that expired without a pod;
- recount GPUQuota use from live pods plus open reservations (like ResourceQuota's
  controller), correcting any drift from crashed admissions;
- publish each GPUNode's allocation summary for ``kubectl get gpunodes``.

Every write is CAS-guarded; a conflict just waits for the next round.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from fracgpu.model import GPUAllocation, Quota, ResourceAmounts, virtual_memory_mib
from fracgpu.names import CORES_PER_GPU
from webhook.cluster import stores
from webhook.cluster.apiclient import ApiError, KubeApi
from webhook.cluster.kubestate import KubeState
from webhook.cluster.records import GPUNodeRecord, QuotaRecord
from webhook.rules import quota as quotalib

log = logging.getLogger(__name__)


@dataclass
class RoundReport:
    reservations_pruned: int = 0
    refused_released: int = 0  # reservations of pods a later admission step refused
    quotas_corrected: int = 0
    nodes_summarised: int = 0
    conflicts: int = 0


class Controllers:
    def __init__(
        self,
        api: KubeApi,
        state: KubeState,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._state = state
        self._interval_s = interval_s
        self._clock = clock
        # Set when a GPUQuota without status appears: the next round starts at once, so a new
        # quota shows its use (zero) without waiting for the interval.
        self._wake = asyncio.Event()
        state.gpuquotas.add_listener(self._on_quota)

    def _on_quota(self, _key: str, _old: Quota | None, new: Quota | None) -> None:
        if isinstance(new, QuotaRecord) and not new.has_status:
            self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            if self._state.ready():
                try:
                    await self.reconcile_once()
                except (ApiError, aiohttp.ClientError, TimeoutError) as error:
                    log.warning("controller round failed: %s", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval_s)

    async def reconcile_once(self) -> RoundReport:
        report = RoundReport()
        report.refused_released = await self._state.release_refused()
        await self._prune_reservations(report)
        await self._recount_quotas(report)
        await self._summarise_nodes(report)
        return report

    # -- reservations -----------------------------------------------------------------------
    async def _prune_reservations(self, report: RoundReport) -> None:
        now = self._clock()
        self._state.departed_reservation_ids()  # forgets departures older than one TTL
        for name, seen in self._state.gpunodes.items():
            if any(self._state.liveness.prunable(held, now) for held in seen.reservations):
                await self._prune_node(name, now, report)

    async def _prune_node(self, name: str, now: float, report: RoundReport) -> None:
        # Under the node's lock: admissions in this replica write the same GPUNode.
        async with self._state.writer.node_lock(name):
            record = self._state.gpunodes.get(name)
            if record is None:
                return
            keep = [
                held for held in record.reservations if not self._state.liveness.prunable(held, now)
            ]
            if len(keep) == len(record.reservations):
                return
            try:
                written = await stores.write_reservations(
                    self._api, name, record.resource_version, keep
                )
            except ApiError as error:
                report.conflicts += 1
                log.info("pruning reservations of %s deferred: %s", name, error)
                return
            self._state.writer.store_written(record, written, tuple(keep))
            report.reservations_pruned += len(record.reservations) - len(keep)

    # -- quota recount ----------------------------------------------------------------------------
    async def _recount_quotas(self, report: RoundReport) -> None:
        """Recount every GPUQuota while no charge of theirs is being written (their locks
        held), so the count and the unwritten charges it covers are taken at one moment."""
        if not len(self._state.gpuquotas):
            return
        keys = sorted(key for key, _ in self._state.gpuquotas.items())
        async with contextlib.AsyncExitStack() as held:
            for key in keys:
                await held.enter_async_context(self._state.writer.node_lock(f"quota:{key}"))
            models = {d.uuid: d.model for _, r in self._state.gpunodes.items() for d in r.devices}
            by_namespace = self._allocations_by_namespace(self._clock())
            covered = self._state.ledger.unwritten_charges()
            for key in keys:
                quota = self._state.gpuquotas.get(key)
                if quota is None:
                    continue
                counted = replace(quota, used=ResourceAmounts(), used_by_model={})
                counted = quotalib.charge(counted, by_namespace.get(quota.namespace, []), models)
                new = isinstance(quota, QuotaRecord) and not quota.has_status
                if new or not _same_use(counted, quota):
                    try:
                        written = await stores.write_quota_used(self._api, counted)
                    except ApiError as error:
                        report.conflicts += 1
                        log.info("recount of %s deferred: %s", key, error)
                        continue
                    self._state.gpuquotas.put(written)
                    report.quotas_corrected += 1
                self._state.ledger.charges_written(key, covered.get(key, ()))

    def _allocations_by_namespace(self, now: float) -> dict[str, list[GPUAllocation]]:
        """What holds GPU use, by namespace: live pods, open reservations, and the claims
        this leader has not written yet."""
        result: dict[str, list[GPUAllocation]] = {}
        live = self._state.liveness.live_reservation_ids()
        departed = self._state.departed_reservation_ids()
        unwritten = self._state.unwritten_claims()
        # A reservation ID counts once: a pod being placed from the queue counts its claim.
        binding = {c.reservation.id for c in unwritten if c.reservation.node}
        for _, pod in self._state.pods.items():
            if pod.assignment is not None and not pod.terminal:
                result.setdefault(pod.namespace, []).extend(pod.assignment.allocations())
            elif pod.waiting and pod.queued is not None and pod.reservation_id not in binding:
                result.setdefault(pod.namespace, []).extend(pod.queued.charge())
        written = set()
        for _, record in self._state.gpunodes.items():
            for held in record.reservations:
                written.add(held.id)
                if quotalib.reservation_charges(held, now, live, departed):
                    result.setdefault(held.namespace, []).extend(held.allocations)
        for claim in unwritten:
            held = claim.reservation
            if held.id not in written:
                result.setdefault(held.namespace, []).extend(held.allocations)
        return result

    # -- GPUNode summaries --------------------------------------------------------------------
    async def _summarise_nodes(self, report: RoundReport) -> None:
        """Publish the summary of every node that changed since the last round (all of them in
        a replica's first round as leader)."""
        changed = self._state.sync.take_changed_nodes()
        pending = (
            sorted(n for n, _ in self._state.gpunodes.items())
            if changed is None
            else sorted(changed)
        )
        try:
            while pending:
                await self._summarise_node(pending[-1], report)
                pending.pop()
        finally:
            self._state.sync.requeue_changed_nodes(pending)  # a failed round retries them

    async def _summarise_node(self, name: str, report: RoundReport) -> None:
        async with self._state.writer.node_lock(name):
            record = self._state.gpunodes.get(name)
            if record is None:
                return
            view = await self._state.view()
            allocated, summary = _summary(
                record, view.gpu_free if record.devices else None, view.memory_scaling(name)
            )
            published = json.dumps({"allocated": allocated, "summary": summary}, sort_keys=True)
            if published == record.published:
                return
            try:
                written = await stores.write_allocation_summary(
                    self._api, name, record.resource_version, allocated, summary
                )
            except ApiError as error:
                report.conflicts += 1
                log.info("summary of %s deferred: %s", name, error)
                return
            self._state.gpunodes.put(written)
            report.nodes_summarised += 1


def _same_use(a: Quota, b: Quota) -> bool:
    def nonzero(q: Quota) -> dict[str, ResourceAmounts]:
        return {k: v for k, v in q.used_by_model.items() if v != ResourceAmounts()}

    return a.used == b.used and nonzero(a) == nonzero(b)


def _summary(
    record: GPUNodeRecord,
    gpu_free: Callable[[str, str], tuple[int, int, int]] | None,
    memory_scaling: float,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Use per GPU and in all; memory counts the virtual total when the node scales it."""
    allocated: list[dict[str, Any]] = []
    used_cores = used_memory = total_memory = 0
    for device in record.devices:
        offered = virtual_memory_mib(device.memory_mib, memory_scaling)
        free_cores, free_memory, count = CORES_PER_GPU, offered, 0
        if gpu_free is not None and not record.unschedulable:
            with contextlib.suppress(KeyError):
                free_cores, free_memory, count = gpu_free(record.name, device.uuid)
        cores = CORES_PER_GPU - free_cores
        memory = offered - free_memory
        allocated.append(
            {"uuid": device.uuid, "cores": cores, "memoryMiB": memory, "containers": count}
        )
        used_cores += cores
        used_memory += memory
        total_memory += offered
    models = sorted({d.model for d in record.devices})
    summary = {
        "gpus": len(record.devices),
        "model": models[0] if len(models) == 1 else ("mixed" if models else ""),
        "compute": f"{used_cores}/{CORES_PER_GPU * len(record.devices)}",
        "memoryMiB": f"{used_memory}/{total_memory}",
    }
    return allocated, summary
