"""Faults on the real node: kubelet restarts, agent restarts and crashes, pod deletion.
After each, the agent's accounting (its metrics, from kubelet's pod-resources API and the
limits files) equals a recount from the live pods' assignments, and the GPU's capacity is
neither lost nor counted twice."""

from __future__ import annotations

import uuid

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from fracgpu import codec, names

from .pods import (
    admission_denial,
    create,
    delete,
    pod_body,
    probe_script,
    run_probe,
    sections,
    wait_running,
)
from .tier.tier import GPU_UUID, NODE_NAME, NodeTier, wait_for

GPU_LABELS = f'{{gpu="{GPU_UUID}",index="0",model="NVIDIA Fake GPU 16GB",node="{NODE_NAME}"}}'
MIB = 1 << 20


def tke(cores: int, blocks: int) -> dict[str, str]:
    return {names.RESOURCE_VCUDA_CORE: str(cores), names.RESOURCE_VCUDA_MEMORY: str(blocks)}


def recount(tier: NodeTier) -> tuple[int, int, int]:
    """(cores, memory bytes, containers) promised to live pods on the GPU, counted from their
    assignments in the API."""
    cores = memory = containers = 0
    for pod in tier.core.list_pod_for_all_namespaces().items:
        text = (pod.metadata.annotations or {}).get(names.ANNOTATION_ASSIGNMENT)
        if not text or pod.status.phase not in ("Pending", "Running"):
            continue
        for container in codec.decode_assignment(text).containers:
            mine = [a for a in container.devices if a.uuid == GPU_UUID]
            cores += sum(a.cores for a in mine)
            memory += sum(a.memory_mib * MIB for a in mine)
            containers += 1 if mine else 0
    return cores, memory, containers


def agent_accounting(tier: NodeTier) -> tuple[int, int, int] | None:
    """The same three numbers from the agent's metrics (kubelet's pod-resources API and the
    limits files it wrote)."""
    samples = tier.agent_metrics()
    try:
        return (
            round(samples[f"fracgpu_gpu_allocated_compute_ratio{GPU_LABELS}"] * 100),
            round(samples[f"fracgpu_gpu_allocated_memory_bytes{GPU_LABELS}"]),
            round(samples[f"fracgpu_gpu_containers{GPU_LABELS}"]),
        )
    except KeyError:
        return None


def assert_accounting_matches(tier: NodeTier) -> None:
    wait_for(
        lambda: agent_accounting(tier) == recount(tier),
        f"agent's (cores, memory, containers) == recount {recount(tier)}",
        30,
        lambda: f"agent says {agent_accounting(tier)}\n{tier.explain()}",
    )


def sleeper(name: str, cores: int, blocks: int = 4) -> dict[str, object]:
    return pod_body(name, limits=tke(cores, blocks))


def check_limits_inside(tier: NodeTier, namespace: str, name: str, cores: int) -> None:
    pod = tier.core.read_namespaced_pod(name, namespace)
    (status,) = pod.status.container_statuses
    text = tier.exec_in(status.container_id, "cat", "/etc/fracgpu/limits")
    assert f"device.0.core_limit={cores}" in text.splitlines(), text


def test_kubelet_restart_plugins_reregister_running_keep_limits_new_pods_start(
    node_tier: NodeTier, namespace: str
) -> None:
    create(node_tier, namespace, sleeper("before", 40))
    wait_running(node_tier, namespace, "before")
    registered = node_tier.registrations()

    node_tier.restart_kubelet()
    # kubelet deleted the plugin sockets; the agent noticed and registered both plugins again.
    wait_for(
        lambda: node_tier.registrations() >= registered + 2,
        "the agent's plugins registered again",
        30,
        node_tier.explain,
    )
    node_tier.wait_node_ready()
    node_tier.wait_gpu_allocatable()
    # The running container was left alone and still holds its limits.
    assert (
        wait_running(node_tier, namespace, "before").status.container_statuses[0].restart_count == 0
    )
    check_limits_inside(node_tier, namespace, "before", 40)

    report = run_probe(
        node_tier, namespace, pod_body("after", limits=tke(30, 8), command=probe_script())
    )
    assert "device.0.core_limit=30" in sections(report)["limits"], report
    assert_accounting_matches(node_tier)


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "sigkill"])
def test_agent_restart_counts_nothing_twice(
    node_tier: NodeTier, namespace: str, crash: bool
) -> None:
    create(node_tier, namespace, sleeper("holder", 60))
    wait_running(node_tier, namespace, "holder")
    assert_accounting_matches(node_tier)
    registered = node_tier.registrations()

    node_tier.restart_agent(crash=crash)
    wait_for(
        lambda: node_tier.registrations() >= registered + 2,
        "the restarted agent's plugins registered",
        30,
        node_tier.explain,
    )
    node_tier.wait_gpu_allocatable()
    check_limits_inside(node_tier, namespace, "holder", 60)
    assert_accounting_matches(node_tier)

    # 60 of 100 cores are held: 50 more cannot be had (nothing was forgotten) ...
    denial = admission_denial(node_tier, namespace, sleeper("too-big", 50))
    assert "50" in denial, denial
    # ... and exactly the 40 left can (nothing counted twice), by webhook and kubelet alike.
    create(node_tier, namespace, sleeper("rest", 40))
    wait_running(node_tier, namespace, "rest")
    check_limits_inside(node_tier, namespace, "rest", 40)
    assert_accounting_matches(node_tier)


def test_pod_delete_frees_its_slice(node_tier: NodeTier, namespace: str) -> None:
    create(node_tier, namespace, sleeper("first", 70))
    wait_running(node_tier, namespace, "first")
    admission_denial(node_tier, namespace, sleeper("blocked", 70))

    delete(node_tier, namespace, "first")
    assert_accounting_matches(node_tier)
    name = f"second-{uuid.uuid4().hex[:4]}"

    def admitted() -> bool:
        try:
            create(node_tier, namespace, sleeper(name, 70))
        except Exception:  # the webhook's view catches up with the deletion
            return False
        return True

    wait_for(admitted, "a 70-core pod admitted after the first was deleted", 30)
    wait_running(node_tier, namespace, name)
    assert_accounting_matches(node_tier)


def gpunode_health(tier: NodeTier) -> list[bool]:
    custom = kubernetes.client.CustomObjectsApi(tier.admin)
    obj = custom.get_cluster_custom_object(
        names.GROUP, names.CRD_VERSION, names.GPUNODE_PLURAL, NODE_NAME
    )
    return [bool(d.get("healthy")) for d in (obj.get("status") or {}).get("devices") or []]


def test_unhealthy_gpu_drops_capacity_new_pods_avoid_it(
    node_tier: NodeTier, namespace: str
) -> None:
    create(node_tier, namespace, sleeper("running", 30))
    wait_running(node_tier, namespace, "running")
    lost = "device.0.nvml_error.nvmlDeviceGetMemoryInfo"
    node_tier.set_gpu_fault(lost, 15)  # NVML_ERROR_GPU_IS_LOST
    try:
        # kubelet drops the GPU's devices from the node's allocatable; the inventory says so.
        wait_for(
            lambda: node_tier.allocatable().get(names.RESOURCE_VCUDA_CORE) == "0",
            "kubelet's allocatable vcuda-core at 0",
            30,
            node_tier.explain,
        )
        wait_for(lambda: gpunode_health(node_tier) == [False], "GPUNode unhealthy", 30)
        denial = admission_denial(node_tier, namespace, sleeper("new", 10))
        assert "403" in denial or "400" in denial, denial
        # The container already running is left alone, with its limits, and still counted.
        check_limits_inside(node_tier, namespace, "running", 30)
        assert_accounting_matches(node_tier)
    finally:
        node_tier.set_gpu_fault(lost, None)
    wait_for(
        lambda: node_tier.allocatable().get(names.RESOURCE_VCUDA_CORE) == "100",
        "kubelet's allocatable back at 100",
        30,
        node_tier.explain,
    )
    wait_for(lambda: gpunode_health(node_tier) == [True], "GPUNode healthy again", 30)

    def admitted() -> bool:
        try:
            create(node_tier, namespace, sleeper("healed", 10))
        except ApiException:
            return False
        return True

    wait_for(admitted, "a pod admitted on the healed GPU", 30)
    wait_running(node_tier, namespace, "healed")
    assert_accounting_matches(node_tier)


def test_drain_evicts_gpu_pods_and_new_ones_avoid_the_node(
    node_tier: NodeTier, namespace: str
) -> None:
    create(node_tier, namespace, sleeper("drained", 50))
    wait_running(node_tier, namespace, "drained")
    # What `kubectl drain` does: cordon, then evict through the Eviction API.
    node_tier.cordon(True)
    try:
        node_tier.core.create_namespaced_pod_eviction(
            "drained",
            namespace,
            {
                "apiVersion": "policy/v1beta1",
                "kind": "Eviction",
                "metadata": {"name": "drained", "namespace": namespace},
            },
        )
        wait_for(
            lambda: not node_tier.core.list_namespaced_pod(namespace).items,
            "the evicted pod gone",
            60,
            node_tier.explain,
        )
        assert_accounting_matches(node_tier)
        # Refused at admission rather than left Pending at the scheduler. (The reason given
        # today is the generic one about selectors and tolerations: the cordon's taint
        # node.kubernetes.io/unschedulable is checked before the node's unschedulable flag.)
        denial = admission_denial(node_tier, namespace, sleeper("while-cordoned", 10))
        assert denial.startswith("403") and "mutate.fracgpu.io" in denial, denial
    finally:
        node_tier.cordon(False)

    def admitted() -> bool:
        try:
            create(node_tier, namespace, sleeper("after-uncordon", 100))
        except ApiException:
            return False
        return True

    # The whole GPU is free again: the drained pod's slice was released.
    wait_for(admitted, "a whole-GPU pod admitted after uncordon", 30)
    wait_running(node_tier, namespace, "after-uncordon")
    assert_accounting_matches(node_tier)


def test_node_removal_drops_its_capacity_and_its_pods_and_a_returning_node_is_whole(
    node_tier: NodeTier, namespace: str
) -> None:
    create(node_tier, namespace, sleeper("stranded", 40))
    wait_running(node_tier, namespace, "stranded")
    node_tier.remove_node()
    try:
        # Placement leaves a GPUNode without its Node out: no GPU pod is placed there once
        # the webhook's watch has seen the Node go. A create in the moment between the
        # delete and that event may still be placed on it (CI saw one, once); such pods
        # are deleted, and from the first refusal on every create must be refused.
        admitted_early: list[str] = []

        def refused() -> str | None:
            name = f"new-{uuid.uuid4().hex[:4]}"
            try:
                create(node_tier, namespace, sleeper(name, 10))
            except ApiException as error:
                return f"{error.status} {error.body}"
            admitted_early.append(name)
            return None

        denial = wait_for(refused, "a new GPU pod refused with the node gone", 30)
        assert denial.startswith("403") and "mutate.fracgpu.io" in denial, denial
        for _ in range(3):
            again = refused()
            assert again is not None and again.startswith("403"), admitted_early
        for name in admitted_early:
            node_tier.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

        def only_stranded() -> bool:
            pods = node_tier.core.list_namespaced_pod(namespace).items
            return all(p.metadata.name == "stranded" for p in pods)

        wait_for(only_stranded, "pods admitted before the webhook saw the node go deleted", 30)
        # The pod GC deletes pods bound to a node that stays gone (40 s quarantine in 1.20):
        # the pod is accounted as gone, and nothing is promised on the GPU any more.
        wait_for(
            lambda: not node_tier.core.list_namespaced_pod(namespace).items,
            "the stranded pod deleted by the pod GC",
            150,
            node_tier.explain,
        )
        assert recount(node_tier) == (0, 0, 0)
    finally:
        node_tier.restore_node()

    # Back: the whole GPU can be had (the stranded pod's slice was not kept), and the
    # kubelet that returned killed the orphan's container rather than count it.
    def admitted() -> bool:
        try:
            create(node_tier, namespace, sleeper("whole", 100))
        except ApiException:
            return False
        return True

    wait_for(admitted, "a whole-GPU pod admitted on the returned node", 60, node_tier.explain)
    wait_running(node_tier, namespace, "whole", timeout=90)
    assert_accounting_matches(node_tier)
