"""The Kubernetes back end against a real kube-apiserver: the leader places, others forward.

Each replica is a KubeState with its own watch caches and connection pool, as in two webhook
pods; whether it leads is handed in (the elector's part is tested in test_webhook_flow).
Admission is emulated by place-then-reserve with re-planning, as the webhook does.
"""

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from fracgpu import codec, names
from fracgpu.model import (
    Assignment,
    ContainerAssignment,
    ContainerRequest,
    MemoryRequest,
    Reservation,
)
from fracgpu.placement import NoFit, PodDemand, Policy
from tests.webhook.test_cluster_bookkeeping import kube_settings
from webhook.cluster.apiclient import KubeApi, endpoint_from_kubeconfig
from webhook.cluster.controllers import Controllers
from webhook.cluster.kubestate import KubeState
from webhook.cluster.leader import Leadership
from webhook.state.backend import Claim, ForwardToLeader, RejectKind, ReserveRejected

from .fixtures import NodeFactory
from .harness.resources import FRACGPU_GROUP, FRACGPU_VERSION, create_gpuquota

pytestmark = pytest.mark.e2e
TTL = 60


LEADER_URL = "https://leader.example:8443"


def leading() -> Leadership:
    """A leadership that places from now on and never needs renewing."""
    return Leadership(placing_from=0.0, valid_until=float("inf"), own_url=LEADER_URL)


def following() -> Leadership:
    return Leadership(leader_url=LEADER_URL)


@contextlib.asynccontextmanager
async def replica(
    kubeconfig: Path, leadership: Leadership | None = None, **settings: Any
) -> AsyncIterator[tuple[KubeApi, KubeState]]:
    api = KubeApi(endpoint_from_kubeconfig(str(kubeconfig)))
    async with api:
        state = KubeState(
            api,
            kube_settings(reservation_ttl_s=TTL, **settings),
            leadership=leadership or leading(),
        )
        task = asyncio.create_task(state.run())
        try:
            for _ in range(200):
                if state.ready():
                    break
                await asyncio.sleep(0.05)
            assert state.ready(), "watch caches never synced"
            yield api, state
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def wait_for(predicate: Any, what: str, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def admit(state: KubeState, namespace: str, cores: int, memory_mib: int) -> Claim | None:
    """Place and reserve one single-container pod, re-planning on lost races."""
    request = ContainerRequest("main", 1, cores, MemoryRequest(mib=memory_mib))
    for _ in range(8):
        view = await state.view()
        placed = view.place(PodDemand((request,)), Policy.BINPACK)
        if isinstance(placed, NoFit):
            return None
        allocations = placed.containers[0].devices
        models = {d.uuid: d.model for n in view.nodes() for d in n.devices}
        claim = Claim(
            Reservation(uuid.uuid4().hex, placed.node, namespace, "", allocations, 0),
            0,
            0,
            models,
        )
        try:
            await state.reserve(claim)
        except ReserveRejected as error:
            if error.kind is RejectKind.QUOTA:
                return None
            continue
        return claim
    return None


def gpunode_reservations(client: kubernetes.client.ApiClient, name: str) -> list[dict[str, Any]]:
    obj = kubernetes.client.CustomObjectsApi(client).get_cluster_custom_object(
        FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", name
    )
    return list((obj.get("status") or {}).get("reservations") or [])


def cores_per_gpu(reservations: list[dict[str, Any]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for held in reservations:
        for alloc in held["allocations"]:
            total[alloc["uuid"]] = total.get(alloc["uuid"], 0) + alloc["cores"]
    return total


async def test_the_leader_never_overcommits_and_a_follower_forwards(
    kubeconfig: Path, nodes: NodeFactory, kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    node = f"race-{uuid.uuid4().hex[:6]}"
    nodes.gpu_node(node, gpus=2, memory_mib=40960)
    async with (
        replica(kubeconfig, write_behind_s=1.5) as (_, leader),
        replica(kubeconfig, following()) as (_, follower),
    ):
        await wait_for(lambda: leader.gpunodes.get(node) and follower.gpunodes.get(node), "GPUNode")
        claims = await asyncio.gather(*(admit(leader, namespace, 30, 1024) for _ in range(20)))
        granted = [c for c in claims if c is not None]
        # 2 GPUs x 3 slices of 30 cores: exactly six fit, all at once in memory.
        assert len(granted) == 6
        with pytest.raises(ForwardToLeader) as forwarded:
            await admit(follower, namespace, 10, 1024)
        assert forwarded.value.leader_url == LEADER_URL
        some = granted[0].reservation
        # Not written yet (the leader waits 1.5 s to batch): only the leader can vouch for it.
        with pytest.raises(ForwardToLeader):
            await follower.reservation(some.id, node)
        held = await leader.reservation(some.id, node)
        assert held is not None and held.allocations == some.allocations
        # Written behind: a few writes carry all six, and the follower's cache learns them.
        await wait_for(lambda: not leader.ledger.unwritten(), "everything written")
        per_gpu = cores_per_gpu(gpunode_reservations(kube_client, node))
        assert sorted(per_gpu.values()) == [90, 90]
        await wait_for(
            lambda: len(follower.gpunodes.get(node).reservations) == 6,  # type: ignore[union-attr]
            "the follower's watch",
        )
        assert await follower.reservation(some.id, node) == held


async def test_a_successor_counts_what_its_predecessor_wrote(
    kubeconfig: Path, nodes: NodeFactory, kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    node = f"succ-{uuid.uuid4().hex[:6]}"
    nodes.gpu_node(node, gpus=1, memory_mib=40960)
    async with replica(kubeconfig) as (_, first):
        await wait_for(lambda: first.gpunodes.get(node) is not None, "GPUNode")
        assert await admit(first, namespace, 40, 1024) is not None
        assert await admit(first, namespace, 40, 1024) is not None
        assert await first.writer.flush(10), "a leader handing over writes everything first"
    async with replica(kubeconfig) as (_, second):
        await wait_for(lambda: second.gpunodes.get(node) is not None, "GPUNode")
        assert await admit(second, namespace, 30, 1024) is None  # 80 of 100 taken
        assert await admit(second, namespace, 20, 1024) is not None


async def test_concurrent_charges_never_pass_the_quota(
    kubeconfig: Path, nodes: NodeFactory, kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    node = f"quota-{uuid.uuid4().hex[:6]}"
    nodes.gpu_node(node, gpus=4, memory_mib=40960)
    create_gpuquota(kube_client, namespace, {"cores": 100})
    async with replica(kubeconfig) as (_, leader):
        await wait_for(
            lambda: (
                bool(leader.gpuquotas.get(f"{namespace}/gpu"))
                and leader.gpunodes.get(node) is not None
            ),
            "quota and GPUNode in the cache",
        )
        claims = await asyncio.gather(*(admit(leader, namespace, 30, 1024) for _ in range(12)))
        granted = [c for c in claims if c is not None]
        assert len(granted) == 3  # 3 x 30 <= 100 < 4 x 30
        # Charges wait for the recount; a leader handing over writes them itself.
        assert await leader.writer.flush(10)
    quota = kubernetes.client.CustomObjectsApi(kube_client).get_namespaced_custom_object(
        FRACGPU_GROUP, FRACGPU_VERSION, namespace, "gpuquotas", "gpu"
    )
    assert quota["status"]["used"]["cores"] == 90


async def test_release_gives_back_gpu_and_quota(
    kubeconfig: Path, nodes: NodeFactory, kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    node = f"rel-{uuid.uuid4().hex[:6]}"
    nodes.gpu_node(node, gpus=1, memory_mib=40960)
    custom = kubernetes.client.CustomObjectsApi(kube_client)
    create_gpuquota(kube_client, namespace, {"cores": 50})

    def used_cores() -> int:
        quota = custom.get_namespaced_custom_object(
            FRACGPU_GROUP, FRACGPU_VERSION, namespace, "gpuquotas", "gpu"
        )
        return int(((quota.get("status") or {}).get("used") or {}).get("cores") or 0)

    async with replica(kubeconfig) as (_, state):
        await wait_for(lambda: state.gpuquotas.get(f"{namespace}/gpu") is not None, "quota")
        await wait_for(lambda: state.gpunodes.get(node) is not None, "GPUNode")
        # Released before it was written: nothing ever reaches the API server.
        claim = await admit(state, namespace, 50, 1024)
        assert claim is not None
        assert await admit(state, namespace, 10, 1024) is None  # quota is full
        await state.release(claim.reservation.id)
        assert await state.writer.flush(10)
        assert gpunode_reservations(kube_client, node) == [] and used_cores() == 0
        # Released after it was written: both writes are taken back.
        claim = await admit(state, namespace, 50, 1024)
        assert claim is not None
        assert await state.writer.flush(10)
        assert len(gpunode_reservations(kube_client, node)) == 1 and used_cores() == 50
        await state.release(claim.reservation.id)
        assert gpunode_reservations(kube_client, node) == [] and used_cores() == 0
        assert await admit(state, namespace, 50, 1024) is not None


async def test_controllers_prune_settled_reservations_and_recount_quota(
    kubeconfig: Path, nodes: NodeFactory, kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    node = f"ctl-{uuid.uuid4().hex[:6]}"
    nodes.gpu_node(node, gpus=1, memory_mib=40960)
    custom = kubernetes.client.CustomObjectsApi(kube_client)
    core = kubernetes.client.CoreV1Api(kube_client)
    create_gpuquota(kube_client, namespace, {"cores": 100})
    async with replica(kubeconfig, settle_s=0.0) as (api, state):
        await wait_for(lambda: state.gpuquotas.get(f"{namespace}/gpu") is not None, "quota")
        await wait_for(lambda: state.gpunodes.get(node) is not None, "GPUNode")
        kept = await admit(state, namespace, 40, 1024)
        lost = await admit(state, namespace, 20, 1024)
        assert kept is not None and lost is not None
        assert await state.writer.flush(10)
        # The first pod really gets created (carrying its reservation ID); the second never does.
        assignment = Assignment(
            node,
            kept.reservation.id,
            (ContainerAssignment("main", kept.reservation.allocations),),
        )
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {
                    "name": "kept",
                    "annotations": {
                        names.ANNOTATION_ASSIGNMENT: codec.encode_assignment(assignment),
                        names.ANNOTATION_RESERVATION_ID: kept.reservation.id,
                    },
                },
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        )
        await wait_for(
            lambda: kept.reservation.id in state.liveness.live_reservation_ids(), "pod in cache"
        )
        later = time.time() + 2 * TTL  # past every reservation's expiry
        controllers = Controllers(api, state, clock=lambda: later)
        report = await controllers.reconcile_once()
        # the live pod's reservation settled, the orphan expired (clock far ahead)
        assert report.reservations_pruned == 2
        assert gpunode_reservations(kube_client, node) == []
        quota = custom.get_namespaced_custom_object(
            FRACGPU_GROUP, FRACGPU_VERSION, namespace, "gpuquotas", "gpu"
        )
        assert quota["status"]["used"]["cores"] == 40  # recounted from the live pod only
        gpunode = custom.get_cluster_custom_object(FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", node)
        assert gpunode["status"]["summary"]["compute"] == "40/100"
        # a second round finds nothing to change
        await asyncio.sleep(0.3)
        again = await controllers.reconcile_once()
        assert (again.reservations_pruned, again.quotas_corrected) == (0, 0)
