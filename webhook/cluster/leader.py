"""Leader election on a coordination.k8s.io/v1 Lease: one replica places pods and runs the
controllers; the others forward placement to it.

A candidate takes the Lease when it is free or its holder has not renewed within
``lease_duration_s``; every write is guarded by resourceVersion, so two candidates can never
both win. The leader renews every ``renew_interval_s`` and writes its own URL into the Lease
(annotation ``fracgpu.io/leader-url``), where followers read it. It places only while its
last renewal is younger than ``renew_deadline_s`` (shorter than the lease), so it has stopped
placing before anyone else may take the Lease.

A leader keeps reservations in memory and writes only those whose pods do not appear soon
(``KubeState``), so a holder that died may have admitted pods that this replica cannot see
yet. A successor therefore waits ``takeover_grace_s`` before placing; after a clean handover
(``release``: the holder stopped placing and wrote every claim first) it waits only
``handover_wait_s``, for the predecessor's newest pods to reach its own pod cache.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp

from webhook.cluster.apiclient import ApiError, ConflictError, KubeApi, NotFoundError

log = logging.getLogger(__name__)
Clock = Callable[[], float]

LEADER_URL_ANNOTATION: Final = "fracgpu.io/leader-url"
# Written by a leader that released the Lease after writing all its reservations.
HANDED_OVER_ANNOTATION: Final = "fracgpu.io/handed-over"


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str
    identity: str
    lease_duration_s: int = 15
    renew_interval_s: float = 5.0
    retry_interval_s: float = 2.0
    # A leader whose last renewal is older than this stops placing (< lease_duration_s).
    renew_deadline_s: float = 10.0
    # This replica's URL for followers' forwarded admissions ("" = none known yet).
    advertise_url: str = ""
    # How long a new leader waits before placing after a holder that did not hand over,
    # and after one that did (the predecessor's newest pods reach this replica's pod cache):
    # operator settings (takeover_grace_seconds, settle_seconds), defaults in webhook.settings.
    takeover_grace_s: float = field(kw_only=True)
    handover_wait_s: float = field(kw_only=True)

    def __post_init__(self) -> None:
        # A leader must stop placing before anyone may take the Lease, and renew before that.
        if not self.renew_interval_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                f"renew_interval_s ({self.renew_interval_s}) < renew_deadline_s "
                f"({self.renew_deadline_s}) < lease_duration_s ({self.lease_duration_s}) "
                "does not hold: a leader could place after another took the Lease"
            )


@dataclass
class Leadership:
    """Who places pods now, as this replica knows it. The elector writes it; the state reads.

    Mutable on purpose: one per replica, owned by that replica's elector.
    """

    clock: Clock = time.time
    placing_from: float | None = None  # when this replica may place; None: not the leader
    valid_until: float = 0.0  # last renewal + renew deadline
    leader_url: str = ""  # the current holder's URL as its Lease names it
    own_url: str = ""

    def placing(self) -> bool:
        if self.placing_from is None:
            return False
        now = self.clock()
        return self.placing_from <= now < self.valid_until

    def leading(self) -> bool:
        return self.placing_from is not None

    def why_not_placing(self) -> str:
        now = self.clock()
        if self.placing_from is None:
            return "this replica is not the leader"
        if now < self.placing_from:
            return (
                f"this replica took over leadership and places pods in "
                f"{self.placing_from - now:.0f} s, once its predecessor's admissions have landed"
            )
        return "this replica could not renew its leadership in time"


def _micro_time(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_micro_time(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        settings: LeaseSettings,
        clock: Clock = time.time,
        leadership: Leadership | None = None,
    ) -> None:
        self._api = api
        self._settings = settings
        self._clock = clock
        self.leadership = leadership or Leadership(clock=clock)
        if settings.advertise_url:
            self.leadership.own_url = settings.advertise_url
        self.transitions_seen = 0
        # The version of the Lease this process last wrote: finding it unchanged means
        # nobody else held it since, even if a renewal failed in between.
        self._written_version = ""
        self._last_refresh = float("-inf")

    @property
    def is_leader(self) -> bool:
        return self.leadership.leading()

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
            self._lost()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def refresh_leader(self) -> str:
        """Read the Lease now (a follower that knows no leader yet); the holder's URL or "".
        At most once per second: during a failover every GPU pod asks."""
        now = self._clock()
        if now - self._last_refresh < 1.0:
            return self.leadership.leader_url
        self._last_refresh = now
        try:
            lease = await self._api.get(self._path)
        except (ApiError, aiohttp.ClientError, TimeoutError):
            return ""
        self._note_holder(lease, self._clock())
        return self.leadership.leader_url

    async def try_acquire_or_renew(self) -> bool:
        """One election round; True when this candidate holds the Lease afterwards."""
        now = self._clock()
        try:
            lease = await self._api.get(self._path)
        except NotFoundError:
            # No Lease yet: nobody has placed anything, so no predecessor to wait for.
            return await self._write(None, now, transitions=0, wait=0.0)
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            log.warning("reading lease failed: %s", error)
            return self._lost()
        spec: dict[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if self._note_holder(lease, now):
            return self._lost()
        transitions = int(spec.get("leaseTransitions") or 0)
        version = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        ours = holder == self._settings.identity and version == self._written_version
        if not ours:
            transitions += 1
        wait: float | None
        if ours:
            wait = None  # a renewal
        elif not holder and _annotations(lease).get(HANDED_OVER_ANNOTATION) == "true":
            wait = self._settings.handover_wait_s
        else:
            wait = self._settings.takeover_grace_s
        return await self._write(lease, now, transitions, wait)

    def _note_holder(self, lease: dict[str, Any], now: float) -> bool:
        """Record the holder's URL; True when another replica holds the Lease now."""
        spec: dict[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = _parse_micro_time(spec.get("renewTime"))
        duration = int(spec.get("leaseDurationSeconds") or self._settings.lease_duration_s)
        other = bool(holder) and holder != self._settings.identity
        held_by_other = other and renewed + duration > now
        self.leadership.leader_url = (
            str(_annotations(lease).get(LEADER_URL_ANNOTATION) or "") if held_by_other else ""
        )
        return held_by_other

    async def _write(
        self, lease: dict[str, Any] | None, now: float, transitions: int, wait: float | None
    ) -> bool:
        """Write the Lease as held by this replica; ``wait`` is how long to wait before
        placing after taking it over (None: a renewal of a Lease this process holds)."""
        s = self._settings
        was_ours = lease is not None and (lease.get("spec") or {}).get("holderIdentity") == (
            s.identity
        )
        acquired = (lease or {}).get("spec", {}).get("acquireTime") if was_ours else None
        spec = {
            "holderIdentity": s.identity,
            "leaseDurationSeconds": s.lease_duration_s,
            "acquireTime": acquired or _micro_time(now),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }
        annotations = {LEADER_URL_ANNOTATION: self.leadership.own_url}
        try:
            if lease is None:
                written = await self._api.create(
                    f"/apis/coordination.k8s.io/v1/namespaces/{s.namespace}/leases",
                    self._lease_body(spec, annotations),
                )
            else:
                written = await self._replace(lease, spec, annotations)
        except ConflictError:
            return self._lost()  # someone else wrote first: re-read next round
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            log.warning("writing lease failed: %s", error)
            return self._lost()
        self.transitions_seen = transitions
        self._written_version = str(written.get("metadata", {}).get("resourceVersion", ""))
        leadership = self.leadership
        if wait is not None:
            leadership.placing_from = now + wait
            if wait:
                log.warning("%s took over %s: placing in %.0f s", s.identity, s.name, wait)
        elif leadership.placing_from is None:
            leadership.placing_from = now  # ours all along; only a renewal had failed
        leadership.valid_until = now + s.renew_deadline_s
        leadership.leader_url = leadership.own_url
        return True

    async def release(self) -> bool:
        """Hand the Lease over cleanly (the caller has stopped placing and written every
        claim): the next holder waits only ``handover_wait_s``. True when released."""
        self._lost()
        try:
            lease = await self._api.get(self._path)
            spec: dict[str, Any] = lease.get("spec") or {}
            if spec.get("holderIdentity") != self._settings.identity:
                return False
            released = {**spec, "holderIdentity": None, "renewTime": _micro_time(self._clock())}
            await self._replace(lease, released, {HANDED_OVER_ANNOTATION: "true"})
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            log.warning("releasing lease failed (the next leader will wait): %s", error)
            return False
        log.info("%s handed over %s", self._settings.identity, self._settings.name)
        return True

    def _lease_body(self, spec: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
        s = self._settings
        metadata = {"name": s.name, "namespace": s.namespace, "annotations": annotations}
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    async def _replace(
        self, lease: dict[str, Any], spec: dict[str, Any], annotations: dict[str, str]
    ) -> dict[str, Any]:
        """Replace ``lease`` (whole: these annotations only) if it is still at its version."""
        body = self._lease_body(spec, annotations)
        body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return await self._api.replace(self._path, body)

    def _lost(self) -> bool:
        self.leadership.placing_from = None
        self.leadership.valid_until = 0.0
        return False


def _annotations(lease: dict[str, Any]) -> dict[str, Any]:
    return (lease.get("metadata") or {}).get("annotations") or {}
