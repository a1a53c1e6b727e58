"""No GPU pod refused because the webhook's leader died (issue 21), measured on the real
apiserver with two replicas behind the balancer: pods are created one after another while
the leader is SIGKILLed, until the survivor places again. In queue mode a replica that
cannot reach a placing leader queues the pod (its quota checked against its own cache; the
new leader's recount confirms it before it is placed): 0 refusals, and every queued pod is
bound by the fracgpu scheduler through the survivor's extender afterwards. Immediate mode,
measured the same way, refuses the pods created while no leader places (the baseline in
docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from fracgpu import names

from .fixtures import NodeFactory
from .harness import ControlPlane, E2EConfig
from .harness.ports import free_port
from .harness.resources import create_gpuquota
from .queue_setup import new_gpu_node, scheduler_running
from .scheduler_harness import fracgpu_scheduler, scheduler_binary
from .webhook_harness import (
    FRACGPU_NAMESPACE,
    TcpBalancer,
    WebhookReplica,
    WebhookTLS,
    install_webhook_rbac,
    register_webhooks,
    running_webhooks,
    unregister_webhooks,
    wait_placing,
)

pytestmark = pytest.mark.e2e
SHARE = {"tencent.com/vcuda-core": "5", "tencent.com/vcuda-memory": "4"}
CREATE_EVERY_S = 0.25
KILL_AFTER_S = 2.0
AFTER_FAILOVER_S = 2.0


@dataclass
class Outcomes:
    counts: Counter[str] = field(default_factory=Counter)
    refusals: list[str] = field(default_factory=list)
    queued: list[str] = field(default_factory=list)
    no_leader_s: float = 0.0


def create_through_failover(
    core: kubernetes.client.CoreV1Api, namespace: str, replicas: list[WebhookReplica]
) -> Outcomes:
    """Create pods every CREATE_EVERY_S; SIGKILL the placing replica after KILL_AFTER_S; stop
    AFTER_FAILOVER_S after the survivor places."""
    leader = next(r for r in replicas if r.placing())
    survivor = next(r for r in replicas if r is not leader)
    outcomes = Outcomes()
    started, killed_at, placing_at = time.monotonic(), 0.0, 0.0
    i = 0
    while not placing_at or time.monotonic() < placing_at + AFTER_FAILOVER_S:
        now = time.monotonic()
        if not killed_at and now - started >= KILL_AFTER_S:
            leader.kill()
            killed_at = time.monotonic()
        if killed_at and not placing_at and survivor.placing():
            placing_at = time.monotonic()
            outcomes.no_leader_s = placing_at - killed_at
        name = f"p{i:04d}"
        i += 1
        body = {
            "metadata": {"name": name},
            "spec": {
                "containers": [{"name": "main", "image": "cuda", "resources": {"limits": SHARE}}]
            },
        }
        try:
            pod = core.create_namespaced_pod(namespace, body)
        except ApiException as error:
            outcomes.counts["refused"] += 1
            outcomes.refusals.append(f"{name}: {error.status} {error.body}")
        else:
            annotations = pod.metadata.annotations or {}
            if names.ANNOTATION_ASSIGNMENT in annotations:
                outcomes.counts["placed"] += 1
            elif names.ANNOTATION_QUEUED in annotations:
                outcomes.counts["queued"] += 1
                outcomes.queued.append(name)
            else:
                outcomes.counts["other"] += 1
        time.sleep(max(0.0, CREATE_EVERY_S - (time.monotonic() - now)))
        assert time.monotonic() - started < 120, "the survivor never placed"
    return outcomes


@pytest.mark.parametrize("mode", ["queue", "immediate"])
def test_creates_during_a_leader_kill(
    mode: str,
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    e2e_config: E2EConfig,
    nodes: NodeFactory,
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    binary = scheduler_binary(e2e_config) if mode == "queue" else None
    for n in range(2):
        new_gpu_node(nodes, f"fo-{n}", gpus=8)
    create_gpuquota(kube_client, namespace, {"cores": 100_000})
    ports = [free_port(), free_port()]
    work = tmp_path_factory.mktemp(f"failover-{mode}")
    core = kubernetes.client.CoreV1Api(kube_client)
    with running_webhooks(
        kube_client,
        control_plane.kubeconfig("webhook"),
        work,
        ["--placement-mode", mode],
        replicas=2,
        per_replica=lambda i: ["--extender-port", str(ports[i])],
    ) as running:
        outcomes = create_through_failover(core, namespace, running.replicas)
        total = sum(outcomes.counts.values())
        print(
            f"\n[{mode}] {total} creates, leader killed, survivor placing after "
            f"{outcomes.no_leader_s:.1f} s: {dict(outcomes.counts)}"
        )
        if mode == "immediate":
            # The baseline: creates while no replica places are refused.
            assert outcomes.counts["refused"] > 0
            return
        assert outcomes.counts["refused"] == 0, outcomes.refusals[:3]
        assert outcomes.counts["queued"] > 0
        survivor = next(r for r in running.replicas if r.process and r.process.poll() is None)
        wait_placing([survivor])
        assert binary is not None
        with scheduler_running(
            binary,
            work,
            control_plane.kubeconfig("admin"),
            ports[running.replicas.index(survivor)],
        ):
            deadline = time.monotonic() + 120
            waiting = set(outcomes.queued)
            while waiting and time.monotonic() < deadline:
                for name in sorted(waiting):
                    if core.read_namespaced_pod(name, namespace).spec.node_name:
                        waiting.discard(name)
                time.sleep(1)
            assert not waiting, f"{len(waiting)} queued pods never bound: {sorted(waiting)[:5]}"
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)


def test_pods_queued_without_a_leader_are_let_in_to_quota_in_queue_order(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    e2e_config: E2EConfig,
    nodes: NodeFactory,
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """While another holder keeps the Lease, the replica cannot place and queues every GPU
    pod, checking quota against its own cache only: three pods of 60 cores pass a 100-core
    GPUQuota. Once it leads, its recount counts all three, and at bind the namespace's queued
    pods are let in to quota in queue order: the first binds, the other two wait Pending with
    a quota reason. Queued past quota during a failover, never run past it."""
    binary = scheduler_binary(e2e_config)
    node = new_gpu_node(nodes, "lq", gpus=4)
    create_gpuquota(kube_client, namespace, {"cores": 100})
    coordination = kubernetes.client.CoordinationV1Api(kube_client)
    install_webhook_rbac(kube_client, queue=True)
    ghost = {
        "metadata": {"name": "fracgpu-webhook", "namespace": FRACGPU_NAMESPACE},
        "spec": {
            "holderIdentity": "ghost",
            "leaseDurationSeconds": 3600,
            "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
    with contextlib.suppress(ApiException):
        coordination.delete_namespaced_lease("fracgpu-webhook", FRACGPU_NAMESPACE)
    coordination.create_namespaced_lease(FRACGPU_NAMESPACE, ghost)
    work = tmp_path_factory.mktemp("leaderless")
    tls = WebhookTLS.create(work / "tls")
    port = free_port()
    replica = WebhookReplica(
        "replica-lq",
        control_plane.kubeconfig("webhook"),
        tls,
        work,
        ["--placement-mode", "queue", "--extender-port", str(port)],
    ).start()
    core = kubernetes.client.CoreV1Api(kube_client)
    scheduler = fracgpu_scheduler(
        binary, work / "scheduler", control_plane.kubeconfig("admin"), port, {}
    )
    try:
        replica.wait_ready()
        assert not replica.placing()
        with TcpBalancer([replica.port]) as balancer:
            url = f"https://127.0.0.1:{balancer.port}"
            register_webhooks(kube_client, url, tls.ca_pem)
            try:
                for name in ("first", "second", "third"):
                    body = {
                        "metadata": {"name": name},
                        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {
                            "limits": {"tencent.com/vcuda-core": "60",
                                       "tencent.com/vcuda-memory": "4"}}}]},
                    }  # fmt: skip
                    pod = core.create_namespaced_pod(namespace, body)
                    assert names.ANNOTATION_QUEUED in (pod.metadata.annotations or {}), name
                    time.sleep(0.05)  # distinct arrival times
                coordination.delete_namespaced_lease("fracgpu-webhook", FRACGPU_NAMESPACE)
                wait_placing([replica])
                scheduler.start()
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline:
                    if core.read_namespaced_pod("first", namespace).spec.node_name:
                        break
                    time.sleep(0.5)
                assert core.read_namespaced_pod("first", namespace).spec.node_name == node
                for name in ("second", "third"):
                    reason = ""
                    while time.monotonic() < deadline and "GPUQuota" not in reason:
                        conditions = core.read_namespaced_pod(name, namespace).status.conditions
                        reason = " ".join(c.message or "" for c in conditions or ())
                        time.sleep(0.5)
                    assert "waiting for quota" in reason, (name, reason)
                    assert core.read_namespaced_pod(name, namespace).spec.node_name is None
            finally:
                unregister_webhooks(kube_client, url, tls.ca_pem)
    finally:
        scheduler.stop()
        replica.stop()
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
