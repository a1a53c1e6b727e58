"""Leader election on a coordination.k8s.io/v1 Lease, so one replica runs the controllers.

A candidate takes the Lease when it is free or its holder has not renewed within
``lease_duration_s``; every write is guarded by resourceVersion, so two candidates can never
both win. The leader renews every ``renew_interval_s``; when a renewal fails or finds
another holder it stops leading at once (the controllers are cancelled).
"""

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

from webhook.cluster.apiclient import ApiError, ConflictError, KubeApi, NotFoundError

log = logging.getLogger(__name__)
Clock = Callable[[], float]


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str
    identity: str
    lease_duration_s: int = 15
    renew_interval_s: float = 5.0
    retry_interval_s: float = 2.0


def _micro_time(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_micro_time(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class LeaderElector:
    def __init__(self, api: KubeApi, settings: LeaseSettings, clock: Clock = time.time) -> None:
        self._api = api
        self._settings = settings
        self._clock = clock
        self.is_leader = False
        self.transitions_seen = 0

    @property
    def _path(self) -> str:
        s = self._settings
        return f"/apis/coordination.k8s.io/v1/namespaces/{s.namespace}/leases/{s.name}"

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Campaign forever; while leading, run ``lead`` (cancelled when leadership is lost)."""
        while True:
            if await self.try_acquire_or_renew():
                await self._lead(lead)
            await asyncio.sleep(self._settings.retry_interval_s)

    async def _lead(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        log.info("%s became leader of %s", self._settings.identity, self._settings.name)
        task = asyncio.create_task(lead())
        try:
            while not task.done():
                await asyncio.sleep(self._settings.renew_interval_s)
                if not await self.try_acquire_or_renew():
                    log.warning("%s lost leadership", self._settings.identity)
                    break
        finally:
            self.is_leader = False
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def try_acquire_or_renew(self) -> bool:
        """One election round; True when this candidate holds the Lease afterwards."""
        now = self._clock()
        try:
            lease = await self._api.get(self._path)
        except NotFoundError:
            return await self._write(None, now, transitions=0)
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            log.warning("reading lease failed: %s", error)
            return self._lost()
        spec: dict[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = _parse_micro_time(spec.get("renewTime"))
        duration = int(spec.get("leaseDurationSeconds") or self._settings.lease_duration_s)
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder and holder != self._settings.identity and renewed + duration > now:
            return self._lost()
        if holder != self._settings.identity:
            transitions += 1
        return await self._write(lease, now, transitions)

    async def _write(self, lease: dict[str, Any] | None, now: float, transitions: int) -> bool:
        s = self._settings
        was_ours = lease is not None and (lease.get("spec") or {}).get("holderIdentity") == (
            s.identity
        )
        acquired = (lease or {}).get("spec", {}).get("acquireTime") if was_ours else None
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": s.name, "namespace": s.namespace},
            "spec": {
                "holderIdentity": s.identity,
                "leaseDurationSeconds": s.lease_duration_s,
                "acquireTime": acquired or _micro_time(now),
                "renewTime": _micro_time(now),
                "leaseTransitions": transitions,
            },
        }
        try:
            if lease is None:
                await self._api.create(
                    f"/apis/coordination.k8s.io/v1/namespaces/{s.namespace}/leases", body
                )
            else:
                body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
                await self._api.replace(self._path, body)
        except ConflictError:
            return self._lost()  # someone else wrote first: re-read next round
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            log.warning("writing lease failed: %s", error)
            return self._lost()
        self.transitions_seen = transitions
        self.is_leader = True
        return True

    def _lost(self) -> bool:
        self.is_leader = False
        return False
