"""The leader's periodic self-check against a real API server: a claim that leaked into the
leader's ledger and view after its pod appeared keeps a GPU full until the self-check (run
by the elected leader, as in ``fracgpu serve``) finds it, logs it and gives the slice back."""

import asyncio
import logging
import time
import uuid
from dataclasses import replace
from pathlib import Path

import kubernetes.client
import pytest

from fracgpu import codec, names
from fracgpu.model import Assignment, ContainerAssignment
from tests.webhook.test_cluster_bookkeeping import kube_settings
from webhook.cluster.apiclient import endpoint_from_kubeconfig
from webhook.cluster.leader import LeaseSettings
from webhook.cluster.runtime import ClusterMode, kube_state
from webhook.metrics import Metrics
from webhook.settings import Settings
from webhook.state.backend import Claim

from .fixtures import NodeFactory
from .test_cluster_state import TTL, admit, wait_for

pytestmark = pytest.mark.e2e


def cluster_mode(kubeconfig: Path, namespace: str, self_check_s: float) -> ClusterMode:
    return ClusterMode(
        endpoint=endpoint_from_kubeconfig(str(kubeconfig)),
        state=kube_settings(reservation_ttl_s=TTL, self_check_s=self_check_s),
        lease=LeaseSettings(
            namespace,
            "fracgpu-selfcheck",
            f"replica-{uuid.uuid4().hex[:6]}",
            takeover_grace_s=0,
            handover_wait_s=0,
        ),
        controller_interval_s=3600,  # only the self-check may repair here
        held_wait_s=Settings().held_wait_seconds,
    )


def pod_of(claim: Claim) -> dict[str, object]:
    held = claim.reservation
    assignment = Assignment(held.node, held.id, (ContainerAssignment("main", held.allocations),))
    return {
        "metadata": {
            "name": "trainer",
            "annotations": {
                names.ANNOTATION_ASSIGNMENT: codec.encode_assignment(assignment),
                names.ANNOTATION_RESERVATION_ID: held.id,
            },
        },
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


@pytest.mark.parametrize("self_check_s", [0.3, 3600.0], ids=["self-check", "no-self-check"])
async def test_a_leaked_claim_is_found_logged_and_given_back(
    kubeconfig: Path,
    nodes: NodeFactory,
    kube_client: kubernetes.client.ApiClient,
    namespace: str,
    self_check_s: float,
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = f"drift-{uuid.uuid4().hex[:6]}"
    nodes.gpu_node(node, gpus=1, memory_mib=16384)
    core = kubernetes.client.CoreV1Api(kube_client)
    async with kube_state(cluster_mode(kubeconfig, namespace, self_check_s)) as runtime:
        state = runtime.state
        metrics = Metrics()
        metrics.watch_drift(state.drift_counts)
        await wait_for(lambda: state.ready() and state.gpunodes.get(node), "caches", 20)
        runtime.campaign("")
        await wait_for(state.placing, "leadership", 20)
        admitted = await admit(state, namespace, 60, 4096)
        assert admitted is not None
        core.create_namespaced_pod(namespace, pod_of(admitted))
        rid = admitted.reservation.id
        await wait_for(lambda: state.liveness.is_live(rid), "pod in cache")
        # The pod's claim leaks back into the ledger and the view (as if the pod's arrival
        # had been missed): the GPU looks full although 40 cores are free.
        expires = int(time.time()) + TTL
        claim = replace(admitted, reservation=replace(admitted.reservation, expires_at=expires))
        state.ledger.hold(claim, (), time.time())
        state.sync.allocate(claim)
        assert await admit(state, namespace, 40, 4096) is None
        with caplog.at_level(logging.WARNING, logger="webhook.cluster.selfcheck"):
            if self_check_s > 60:
                await asyncio.sleep(1.0)
                assert await admit(state, namespace, 40, 4096) is None, "drift stays"
                return
            await wait_for(lambda: state.drift_counts().repairs["claim"] >= 1, "self-check", 10)
        where = f"namespace {namespace} claim {rid} on node {node}"
        assert f"{where}: ledger: holds it; recount: its pod is live" in caplog.text
        text = metrics.exposition().decode()
        assert 'fracgpu_webhook_state_drift_repairs_total{kind="claim"} 1.0' in text
        assert state.ledger.inflight(rid) is None
        # the slice the leak held is free again
        assert await admit(state, namespace, 40, 4096) is not None
