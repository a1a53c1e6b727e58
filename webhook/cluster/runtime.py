"""Cluster mode start-up: the Kubernetes state back end plus its leader-elected controllers."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from webhook.cluster.apiclient import Endpoint, KubeApi
from webhook.cluster.controllers import Controllers
from webhook.cluster.kubestate import KubeState, KubeStateSettings
from webhook.cluster.leader import LeaderElector, LeaseSettings
from webhook.queue.scheduler import QueueScheduler
from webhook.queue.status import QueueStatus
from webhook.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterMode:
    endpoint: Endpoint
    state: KubeStateSettings
    lease: LeaseSettings
    controller_interval_s: float
    # Queue mode: how long a pod waits off the nodes placement holds for wider pods.
    held_wait_s: float
    # How long a leader shutting down may take to write what it holds before handing over.
    handover_timeout_s: float = 10.0
    # Queue mode: the node default placement applies when it binds queued pods.
    disable_core_limit: bool = False

    @classmethod
    def from_settings(cls, config: Settings, endpoint: Endpoint) -> "ClusterMode":
        """Cluster mode as the operator's settings describe it (their one home)."""
        return cls(
            endpoint=endpoint,
            state=KubeStateSettings.from_settings(config),
            lease=LeaseSettings(
                config.lease_namespace,
                config.lease_name,
                config.identity,
                takeover_grace_s=config.takeover_grace_seconds,
                handover_wait_s=config.settle_seconds,
            ),
            controller_interval_s=config.controller_interval_seconds,
            disable_core_limit=config.disable_core_limit,
            held_wait_s=config.held_wait_seconds,
        )


@dataclass
class ClusterRuntime:
    """What the server needs of cluster mode: the state, and the elector whose Lease carries
    this replica's URL (known once the server listens)."""

    state: KubeState
    elector: LeaderElector
    controllers: Controllers
    queue: QueueScheduler
    queue_status: QueueStatus
    election: asyncio.Task[None] | None = None

    def campaign(self, url: str) -> None:
        """Start campaigning for the Lease, with ``url`` (unless the settings named one) as
        this replica's address for forwarded admissions: a leader's first Lease write
        already tells the followers where it is."""
        if not self.elector.leadership.own_url:
            self.elector.leadership.own_url = url
        if self.election is None:
            self.election = asyncio.create_task(
                self.elector.run(self._lead), name="leader-election"
            )

    async def _lead(self) -> None:
        """What the leader runs besides placing: the controllers, the self-check, and the
        queue's status on its pods."""
        await asyncio.gather(
            self.controllers.run(),
            self.state.self_check.run(self.state.ready),
            self.queue_status.run(),
        )


@contextlib.asynccontextmanager
async def kube_state(mode: ClusterMode) -> AsyncIterator[ClusterRuntime]:
    """A running KubeState (caches watching; ``campaign`` starts the election once the
    server listens) until the block exits; a leader then stops placing, writes what it
    holds and hands the Lease over."""
    async with KubeApi(mode.endpoint) as api:
        elector = LeaderElector(api, mode.lease)
        state = KubeState(
            api, mode.state, leadership=elector.leadership, find_leader=elector.refresh_leader
        )
        controllers = Controllers(api, state, mode.controller_interval_s)
        caches = asyncio.create_task(state.run(), name="watch-caches")
        queue = QueueScheduler(
            state, api, disable_core_limit=mode.disable_core_limit, held_wait_s=mode.held_wait_s
        )
        status = QueueStatus(api, queue, interval_s=mode.controller_interval_s)
        runtime = ClusterRuntime(state, elector, controllers, queue, status)
        try:
            yield runtime
        finally:
            was_leader = elector.is_leader
            if runtime.election is not None:
                runtime.election.cancel()  # stops placing and the controllers
                await asyncio.gather(runtime.election, return_exceptions=True)
            if was_leader:
                if await state.writer.flush(mode.handover_timeout_s):
                    await elector.release()
                else:
                    log.warning("could not write every reservation: the next leader will wait")
            caches.cancel()
            await asyncio.gather(caches, return_exceptions=True)
