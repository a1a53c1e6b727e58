"""Cluster mode start-up: the Kubernetes ClusterState plus its leader-elected controllers."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from webhook.cluster.apiclient import Endpoint, KubeApi
from webhook.cluster.controllers import Controllers
from webhook.cluster.leader import LeaderElector, LeaseSettings
from webhook.cluster.state import KubeState, KubeStateSettings


@dataclass(frozen=True)
class ClusterMode:
    endpoint: Endpoint
    state: KubeStateSettings
    lease: LeaseSettings
    controller_interval_s: float = 5.0


@contextlib.asynccontextmanager
async def kube_state(mode: ClusterMode) -> AsyncIterator[KubeState]:
    """A running KubeState (caches watching, controllers campaigning) until the block exits."""
    async with KubeApi(mode.endpoint) as api:
        state = KubeState(api, mode.state)
        controllers = Controllers(api, state, mode.state, mode.controller_interval_s)
        elector = LeaderElector(api, mode.lease)
        tasks = [
            asyncio.create_task(state.run(), name="watch-caches"),
            asyncio.create_task(elector.run(controllers.run), name="leader-election"),
        ]
        try:
            yield state
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
