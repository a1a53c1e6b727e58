"""Against a real kube-apiserver: a new GPUQuota gets its status from the leader's
controllers at once, not after the next round or after a pod uses it."""

import asyncio
import contextlib
from pathlib import Path

import kubernetes.client
import pytest

from tests.e2e.harness.resources import FRACGPU_GROUP, FRACGPU_VERSION, create_gpuquota
from tests.e2e.test_cluster_state import replica, wait_for
from webhook.cluster.controllers import Controllers

pytestmark = pytest.mark.e2e


async def test_a_new_gpuquota_gets_its_status_at_once(
    kubeconfig: Path,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    namespace: str,
) -> None:
    custom = kubernetes.client.CustomObjectsApi(kube_client)

    def status(name: str) -> object:
        quota = custom.get_namespaced_custom_object(
            FRACGPU_GROUP, FRACGPU_VERSION, namespace, "gpuquotas", name
        )
        return quota.get("status")

    create_gpuquota(kube_client, namespace, {"cores": 100}, name="before")
    async with replica(kubeconfig) as (api, state):
        # An hour between rounds: only the first round and the wake-up can write anything.
        controllers = Controllers(api, state, interval_s=3600)
        running = asyncio.create_task(controllers.run())
        try:
            await wait_for(lambda: status("before") is not None, "status of an existing quota")
            assert status("before") == {
                "used": {"cores": 0, "memoryMiB": 0, "gpus": 0},
                "usedByModel": {},
            }
            create_gpuquota(kube_client, namespace, {"cores": 50}, name="after")
            await wait_for(lambda: status("after") is not None, "status of a new quota")
            assert status("after") == status("before")
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
