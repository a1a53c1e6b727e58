"""Churn: pod create/delete cycles through two webhook replicas on a real control plane.

At the end no reservation, quota use or allocation may remain, and the replicas' memory must
not grow with the number of cycles. CI runs FRACGPU_CHURN_CYCLES (default 300); the long run
(5000) is `FRACGPU_CHURN_CYCLES=5000 .venv/bin/pytest tests/e2e/test_churn.py -s`; its last
results are in docs/benchmarks.md.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from .fixtures import NodeFactory
from .harness import ControlPlane
from .harness.kube import body
from .harness.resources import FRACGPU_GROUP, FRACGPU_VERSION, create_gpuquota
from .webhook_harness import Webhooks, running_webhooks

pytestmark = pytest.mark.e2e
CYCLES = int(os.environ.get("FRACGPU_CHURN_CYCLES", "300"))
WARMUP = 50
# Python's allocator keeps freed arenas; a leak per cycle would show as MiBs per thousand.
RSS_GROWTH_LIMIT = 24 * 2**20


@pytest.fixture(scope="module")
def webhooks(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Webhooks]:
    extra = ["--reservation-ttl-seconds", "20", "--log-level", "WARNING"]
    with running_webhooks(
        kube_client, control_plane.kubeconfig("webhook"), tmp_path_factory.mktemp("churn"), extra
    ) as running:
        yield running


@pytest.mark.timeout(180 + CYCLES * 0.3)  # the long run outlasts the suite's default limit
def test_create_delete_cycles_leave_nothing_behind_and_do_not_grow_memory(
    webhooks: Webhooks,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    prefix = f"churn-{uuid.uuid4().hex[:4]}"
    infos = [nodes.gpu_node(f"{prefix}-{i}", gpus=2, memory_mib=40960) for i in range(4)]
    custom = kubernetes.client.CustomObjectsApi(kube_client)
    core = kubernetes.client.CoreV1Api(kube_client)
    create_gpuquota(kube_client, namespace, {"cores": 100000})  # fmt: skip
    time.sleep(1.5)
    limits = {"tencent.com/vcuda-core": "25", "tencent.com/vcuda-memory": "8"}
    refused: list[str] = []

    def cycle(i: int) -> None:
        name = f"{prefix}-{i}"
        pod = {
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {"name": "main", "image": "cuda:12", "resources": {"limits": limits}}
                ]
            },
        }
        try:
            core.create_namespaced_pod(namespace, body(pod))
        except ApiException as error:
            refused.append(error.body or str(error.status))
            return
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(cycle, range(WARMUP)))
        start_rss = [r.rss_bytes() for r in webhooks.replicas]
        started = time.monotonic()
        list(pool.map(cycle, range(WARMUP, WARMUP + CYCLES)))
        elapsed = time.monotonic() - started
    end_rss = [r.rss_bytes() for r in webhooks.replicas]
    print(
        f"\nchurn: {CYCLES} cycles in {elapsed:.1f}s ({CYCLES / elapsed:.1f}/s), "
        f"refused {len(refused)}; RSS MiB start {[round(b / 2**20, 1) for b in start_rss]} "
        f"end {[round(b / 2**20, 1) for b in end_rss]}"
    )
    # 8 GPUs x 4 slices, 4 pods in flight at most: every create must fit
    assert not refused, refused[:3]
    for start, end in zip(start_rss, end_rss, strict=True):
        assert end - start < RSS_GROWTH_LIMIT, (start, end)

    def clean() -> bool:
        for info in infos:
            status = (
                custom.get_cluster_custom_object(
                    FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", info.name
                ).get("status")
                or {}
            )
            if status.get("reservations") or status.get("summary", {}).get("compute") != "0/200":
                return False
        quota = custom.get_namespaced_custom_object(
            FRACGPU_GROUP, FRACGPU_VERSION, namespace, "gpuquotas", "gpu"
        )
        return (quota.get("status") or {}).get("used", {}).get("cores") == 0

    deadline = time.monotonic() + 60
    while not clean():
        assert time.monotonic() < deadline, "reservations, allocation or quota use remained"
        time.sleep(0.5)
