"""Where each queued pod stands, on the pod: a condition and one event (the leader writes).

kube-scheduler writes its own PodScheduled condition and FailedScheduling events from the
extender's per-node reasons; this adds fracgpu's view: the condition ``fracgpu.io/Queued``
("waiting for 60 vcuda-core and 4096 MiB on one GPU; 2nd of 5 in the fracgpu queue") and
one ``Queued`` event when a pod is first seen waiting; the condition turns False
("placed on NODE") once the pod is placed. Writes are bounded: a condition is written only
when its message changed and not more often than every ``min_gap_s`` per pod, at most
``max_writes`` per round; the event once per pod.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

import aiohttp

from webhook.cluster import paths
from webhook.cluster.apiclient import ApiError, KubeApi
from webhook.queue.order import asked, ordinal
from webhook.queue.scheduler import QueueScheduler

log = logging.getLogger(__name__)
CONDITION: Final = "fracgpu.io/Queued"
STRATEGIC_MERGE: Final = "application/strategic-merge-patch+json"


@dataclass
class QueueStatus:
    api: KubeApi
    scheduler: QueueScheduler
    interval_s: float = 5.0
    min_gap_s: float = 10.0
    max_writes: int = 20
    clock: Callable[[], float] = time.time
    # Pod key -> (message written, when): bounded by the queue's length.
    _written: dict[str, tuple[str, float]] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except (ApiError, aiohttp.ClientError, TimeoutError) as error:
                log.warning("queue status round failed: %s", error)
            await asyncio.sleep(self.interval_s)

    def message(self, key: str, position: int, total: int, fallback: str) -> str:
        what = self.scheduler.last_reason.get(key) or fallback
        return f"{what}; {ordinal(position)} of {total} in the fracgpu queue"

    async def round(self) -> int:
        """Write the conditions (and first events) that are due; returns how many writes."""
        line = self.scheduler.queue()
        keys = {w.key for w in line}
        now, writes = self.clock(), 0
        for key in [k for k in self._written if k not in keys]:
            # Left the queue: placed (the condition turns False, saying where) or deleted.
            del self._written[key]
            node = self.scheduler.placed_on(key)
            if node and writes < self.max_writes:
                namespace, name = key.split("/", 1)
                await self._condition(namespace, name, f"placed on {node}", waiting=False)
                writes += 1
        for position, waiter in enumerate(line, 1):
            if writes >= self.max_writes:
                break
            text = self.message(
                waiter.key, position, len(line), f"waiting for {asked(waiter.entry)}"
            )
            before = self._written.get(waiter.key)
            if before is not None and (before[0] == text or now - before[1] < self.min_gap_s):
                continue
            if before is None:
                await self._event(waiter.namespace, waiter.name, waiter.uid, text)
                writes += 1
            await self._condition(waiter.namespace, waiter.name, text)
            writes += 1
            self._written[waiter.key] = (text, now)
        return writes

    async def _condition(
        self, namespace: str, name: str, text: str, *, waiting: bool = True
    ) -> None:
        body = {
            "status": {
                "conditions": [
                    {
                        "type": CONDITION,
                        "status": "True" if waiting else "False",
                        "reason": "WaitingForGPU" if waiting else "Placed",
                        "message": text,
                        "lastTransitionTime": _now(self.clock()),
                    }
                ]
            }
        }
        try:
            await self.api.patch(paths.pod_status(namespace, name), body, STRATEGIC_MERGE)
        except ApiError as error:
            log.info("condition of %s/%s not written: %s", namespace, name, error)

    async def _event(self, namespace: str, name: str, uid: str, text: str) -> None:
        stamp = _now(self.clock())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "reason": "Queued",
            "message": text,
            "type": "Normal",
            "source": {"component": "fracgpu-webhook"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.api.create(paths.events_in(namespace), event)
        except ApiError as error:
            log.info("event for %s/%s not written: %s", namespace, name, error)


def _now(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
