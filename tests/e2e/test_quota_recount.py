"""The quota recount charges what admission's view holds: one rule (quota.reservation_charges)."""

import time
import uuid
from pathlib import Path

import kubernetes.client
import pytest

from fracgpu import codec, names
from fracgpu.model import Assignment, ContainerAssignment
from webhook.cluster.controllers import Controllers, RoundReport

from .fixtures import NodeFactory
from .harness.resources import FRACGPU_GROUP, FRACGPU_VERSION, create_gpuquota
from .test_cluster_state import admit, gpunode_reservations, replica, wait_for

pytestmark = pytest.mark.e2e


async def test_a_recount_after_a_reservations_pod_is_gone_does_not_charge_it(
    kubeconfig: Path, nodes: NodeFactory, kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    node = f"gone-{uuid.uuid4().hex[:6]}"
    nodes.gpu_node(node, gpus=1, memory_mib=40960)
    custom = kubernetes.client.CustomObjectsApi(kube_client)
    core = kubernetes.client.CoreV1Api(kube_client)
    create_gpuquota(kube_client, namespace, {"cores": 100})
    # A long settle time: the live pod's reservation stays in its GPUNode, as it does when
    # pruning is deferred by a write conflict.
    async with replica(kubeconfig, settle_s=3600.0) as (api, state):
        await wait_for(lambda: state.gpuquotas.get(f"{namespace}/gpu") is not None, "quota")
        await wait_for(lambda: state.gpunodes.get(node) is not None, "GPUNode")
        claim = await admit(state, namespace, 40, 1024)
        assert claim is not None
        assert await state.writer.flush(10)
        held = claim.reservation
        assignment = Assignment(node, held.id, (ContainerAssignment("main", held.allocations),))
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {
                    "name": "short",
                    "annotations": {
                        names.ANNOTATION_ASSIGNMENT: codec.encode_assignment(assignment),
                        names.ANNOTATION_RESERVATION_ID: held.id,
                    },
                },
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        )
        await wait_for(lambda: held.id in state.liveness.live_reservation_ids(), "pod in cache")
        core.delete_namespaced_pod("short", namespace, grace_period_seconds=0)
        await wait_for(lambda: held.id in state.departed_reservation_ids(), "pod gone")
        # The reservation is still written in its GPUNode and not expired; its pod is gone.
        assert [r["id"] for r in gpunode_reservations(kube_client, node)] == [held.id]
        record = state.gpunodes.get(node)
        assert record is not None and record.reservations[0].expires_at > time.time()
        view = await state.view()
        assert view.gpu_free(node, held.allocations[0].uuid)[0] == 100  # the view frees it
        controllers = Controllers(api, state)
        # The recount step alone: the prune step would drop the reservation first (unless a
        # write conflict defers it, which is when the recount meets it).
        await controllers._recount_quotas(RoundReport())
        quota = custom.get_namespaced_custom_object(
            FRACGPU_GROUP, FRACGPU_VERSION, namespace, "gpuquotas", "gpu"
        )
        assert quota["status"]["used"]["cores"] == 0
