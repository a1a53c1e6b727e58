"""Queue mode on the real node: a GPU pod that does not fit waits Pending with its reason,
and when the blocker goes the stock kube-scheduler (as fracgpu-scheduler, calling the
webhook's extender) binds it, kubelet's Allocate gets its GPU from the agent, and it
starts by itself on the GPU its assignment names, with its slice."""

from __future__ import annotations

from typing import Any

from fracgpu import codec, names
from fracgpu.shim_abi import decode_limits
from tests.e2e.harness.kube import body as harness_body

from .pods import (
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    GIB,
    MIB,
    create,
    cuda_steps,
    delete,
    pod_body,
    probe_script,
    read,
    sections,
    wait_phase,
    wait_running,
)
from .test_faults import assert_accounting_matches, tke
from .tier.tier import NODE_NAME, NodeTier, wait_for

SLICE = 2 * GIB  # 8 blocks of 256 MiB


def waiting_reason(tier: NodeTier, namespace: str, name: str) -> str | None:
    """The PodScheduled=False condition's reason and message, once the pod has one."""
    pod = read(tier, namespace, name)
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return f"{condition.reason}: {condition.message}"
    return None


def test_a_queued_pod_waits_then_starts_by_itself_on_its_assigned_gpu(
    node_tier: NodeTier, namespace: str
) -> None:
    with node_tier.queue_mode():
        create(node_tier, namespace, pod_body("blocker", limits=tke(70, 8)))
        wait_running(node_tier, namespace, "blocker")

        half = SLICE // 2
        steps = f"alloc {SLICE + MIB} alloc {half} alloc {half} alloc {MIB} info"
        body: dict[str, Any] = pod_body("waiter", limits=tke(50, 8), command=probe_script(steps))
        create(node_tier, namespace, body)  # created, not refused
        reason = wait_for(
            lambda: waiting_reason(node_tier, namespace, "waiter"),
            "the waiting pod's PodScheduled=False condition",
            60,
            node_tier.explain,
        )
        waiting = read(node_tier, namespace, "waiter")
        assert waiting.status.phase == "Pending", reason
        assert waiting.spec.scheduler_name == names.DEFAULT_SCHEDULER_NAME
        assert names.ANNOTATION_QUEUED in (waiting.metadata.annotations or {})
        assert names.ANNOTATION_ASSIGNMENT not in (waiting.metadata.annotations or {})
        assert "Unschedulable" in reason and ("core" in reason or "GPU" in reason), reason

        delete(node_tier, namespace, "blocker")
        pod = wait_phase(node_tier, namespace, "waiter", ("Succeeded", "Failed"), 120)
        (status,) = pod.status.container_statuses
        report = str(status.state.terminated.message or "")
        seen = sections(report)

        assert pod.spec.node_name == NODE_NAME
        assignment = codec.decode_assignment(pod.metadata.annotations[names.ANNOTATION_ASSIGNMENT])
        ((gpu),) = [a.uuid for a in assignment.allocations()]
        # The GPU chosen at bind reached the container through Allocate (no env in the spec).
        (container,) = pod.spec.containers
        assert not any(e.name == names.ENV_VISIBLE_DEVICES for e in container.env or []), report
        assert seen["env"] == [f"{names.ENV_VISIBLE_DEVICES}={gpu}"], report
        assert seen["driver"] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"], report

        limits = decode_limits(("\n".join(seen["limits"]) + "\n").encode())
        ((device),) = limits.devices
        assert (limits.pod, limits.pod_uid) == ("waiter", pod.metadata.uid)
        assert (device.uuid, device.memory_limit_bytes, device.core_limit) == (gpu, SLICE, 50)

        steps_seen = cuda_steps(seen["cuda"])
        assert steps_seen[1] == ["info", "0", str(SLICE), str(SLICE)], report
        assert [s[:2] for s in steps_seen[2:6]] == [
            ["alloc", str(CUDA_ERROR_OUT_OF_MEMORY)],
            ["alloc", str(CUDA_SUCCESS)],
            ["alloc", str(CUDA_SUCCESS)],
            ["alloc", str(CUDA_ERROR_OUT_OF_MEMORY)],
        ], report
        nvml = [line.split() for line in seen["nvml"] if line.startswith("mem ")]
        assert [(m[2], m[4]) for m in nvml] == [(gpu, str(SLICE))], report
        assert_accounting_matches(node_tier)


def test_a_queued_pod_whose_env_could_pick_its_gpu_is_not_started(
    node_tier: NodeTier, namespace: str
) -> None:
    """The attack: a queued pod's container brings NVIDIA_VISIBLE_DEVICES through envFrom
    (kubelet puts it after the device plugin's value, so it would win). It must not run."""
    node_tier.core.create_namespaced_config_map(
        namespace,
        harness_body({"metadata": {"name": "gpus"}, "data": {names.ENV_VISIBLE_DEVICES: "all"}}),
    )
    with node_tier.queue_mode():
        create(node_tier, namespace, pod_body("blocker", limits=tke(70, 8)))
        wait_running(node_tier, namespace, "blocker")
        body: dict[str, Any] = pod_body("sneaky", limits=tke(50, 8))
        body["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "gpus"}}]
        try:
            create(node_tier, namespace, body)
        except Exception as error:  # refused at admission: also a pass
            assert "envFrom" in str(error), error
            return
        delete(node_tier, namespace, "blocker")
        pod = wait_phase(node_tier, namespace, "sneaky", ("Failed", "Running", "Succeeded"), 120)
        assert pod.status.phase == "Failed", pod.status
        assert "envFrom[0] has no prefix" in str(pod.status.message), pod.status


def test_queued_pods_of_one_size_released_together_each_start_as_themselves(
    node_tier: NodeTier, namespace: str
) -> None:
    """Two queued pods that kubelet admits back to back, with the same token counts: the
    agent cannot tell them apart by size, yet each container starts with its own limits
    (its pod's name and UID) and its GPU, and nothing is refused or counted twice."""
    with node_tier.queue_mode():
        create(node_tier, namespace, pod_body("blocker", limits=tke(100, 8)))
        wait_running(node_tier, namespace, "blocker")
        twins = ("twin-a", "twin-b")
        for name in twins:
            create(node_tier, namespace, pod_body(name, limits=tke(40, 8)))
        for name in twins:
            wait_for(
                lambda name=name: waiting_reason(node_tier, namespace, name),
                f"{name} waiting",
                60,
                node_tier.explain,
            )
        delete(node_tier, namespace, "blocker")
        for name in twins:
            pod = wait_running(node_tier, namespace, name, timeout=120)
            assignment = codec.decode_assignment(
                pod.metadata.annotations[names.ANNOTATION_ASSIGNMENT]
            )
            ((gpu),) = [a.uuid for a in assignment.allocations()]
            (status,) = pod.status.container_statuses
            limits = decode_limits(
                node_tier.exec_in(status.container_id, "cat", "/etc/fracgpu/limits").encode()
            )
            assert (limits.pod, limits.pod_uid) == (name, pod.metadata.uid)
            assert [d.uuid for d in limits.devices] == [gpu]
            seen = node_tier.exec_in(
                status.container_id, "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"
            )
            assert seen.strip() == gpu
        assert_accounting_matches(node_tier)
