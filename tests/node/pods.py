"""Pods for the node tier's tests and what their containers report.

A probe container runs a busybox shell script whose output goes to its termination message
(/dev/termination-log), so a test reads what the container saw from the pod's status through
the API, exactly as a user would with `kubectl get pod -o yaml`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from tests.e2e.harness.kube import body as harness_body

from .tier.image import IMAGE
from .tier.tier import NodeTier, wait_for

GIB = 1 << 30
MIB = 1 << 20
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2

# What a GPU container reports: its environment's GPU variable, the limits file, whether the
# preload is there, cuMemGetInfo and allocations through the CUDA driver API (mem_ops, a shim
# test program), NVML memory info (nvml_ops), and whether the limits file can be changed.
PROBE = """{
echo "== env"; echo "NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-unset}"
echo "== limits"; cat /etc/fracgpu/limits
echo "== preload"; cat /etc/ld.so.preload
echo "== driver"; ls /usr/lib/x86_64-linux-gnu/libcuda.so.1
echo "== cuda"; /probes/mem_ops ctx 0 info %(steps)s; echo "exit=$?"
echo "== nvml"; /probes/nvml_ops; echo "exit=$?"
echo "== tamper"
if (echo "device.0.memory_limit_bytes=1" >> /etc/fracgpu/limits) 2>/dev/null; then
  echo "limits writable"; else echo "limits read-only"; fi
} > /dev/termination-log 2>&1
"""


def probe_script(steps: str = "") -> str:
    return PROBE % {"steps": steps}


def pod_body(
    name: str,
    *,
    limits: Mapping[str, str] | None = None,
    command: str = "sleep 2147483647",
    annotations: Mapping[str, str] | None = None,
    restart: str = "Never",
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", command],
        "terminationMessagePolicy": "File",
    }
    if limits:
        container["resources"] = {"limits": dict(limits)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "containers": [container],
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "enableServiceLinks": False,
        },
    }


def new_namespace(tier: NodeTier) -> str:
    name = f"node-{uuid.uuid4().hex[:8]}"
    tier.core.create_namespace(harness_body({"metadata": {"name": name}}))
    return name


def create(tier: NodeTier, namespace: str, body: dict[str, Any]) -> kubernetes.client.V1Pod:
    return tier.core.create_namespaced_pod(namespace, harness_body(body))


def admission_denial(tier: NodeTier, namespace: str, body: dict[str, Any]) -> str:
    """The API's answer to a pod it refuses; fails the test if it is admitted."""
    try:
        create(tier, namespace, body)
    except ApiException as error:
        return f"{error.status} {error.body}"
    raise AssertionError(f"pod {body['metadata']['name']} was admitted")


def read(tier: NodeTier, namespace: str, name: str) -> kubernetes.client.V1Pod:
    return tier.core.read_namespaced_pod(name, namespace)


def _describe(tier: NodeTier, namespace: str, name: str) -> str:
    try:
        pod = read(tier, namespace, name)
        events = tier.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        ).items
    except ApiException as error:
        return f"pod {namespace}/{name}: {error.status}"
    lines = [f"pod {namespace}/{name}: phase {pod.status.phase}, {pod.status.container_statuses}"]
    lines += [f"event {e.reason}: {e.message}" for e in events]
    return "\n".join(lines) + "\n" + tier.explain()


def wait_phase(
    tier: NodeTier, namespace: str, name: str, phases: tuple[str, ...], timeout: float = 60
) -> kubernetes.client.V1Pod:
    def reached() -> kubernetes.client.V1Pod | None:
        pod = read(tier, namespace, name)
        return pod if pod.status.phase in phases else None

    return wait_for(
        reached, f"pod {name} {'/'.join(phases)}", timeout, lambda: _describe(tier, namespace, name)
    )


def wait_running(tier: NodeTier, namespace: str, name: str, timeout: float = 60) -> Any:
    return wait_phase(tier, namespace, name, ("Running",), timeout)


def run_probe(tier: NodeTier, namespace: str, body: dict[str, Any], timeout: float = 90) -> str:
    """Create a pod whose container writes a report, wait until it ends, return the report."""
    create(tier, namespace, body)
    name = body["metadata"]["name"]
    pod = wait_phase(tier, namespace, name, ("Succeeded", "Failed"), timeout)
    (status,) = pod.status.container_statuses
    terminated = status.state.terminated
    assert terminated is not None, _describe(tier, namespace, name)
    return str(terminated.message or "")


def sections(report: str) -> dict[str, list[str]]:
    """The report's `== name` sections, each as its lines."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in report.splitlines():
        if line.startswith("== "):
            current = line[3:].strip()
            out[current] = []
        elif current:
            out[current].append(line)
    return out


def cuda_steps(lines: list[str]) -> list[list[str]]:
    """mem_ops' output lines ("<step> <CUresult> [values]"), split."""
    return [line.split() for line in lines if line and not line.startswith("exit=")]


def delete(tier: NodeTier, namespace: str, name: str, timeout: float = 60) -> None:
    """Delete a pod and wait until kubelet has torn it down and the object is gone."""
    try:
        tier.core.delete_namespaced_pod(name, namespace, grace_period_seconds=1)
    except ApiException as error:
        if error.status != 404:
            raise

    def gone() -> bool:
        try:
            read(tier, namespace, name)
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(gone, f"pod {name} deleted", timeout, lambda: _describe(tier, namespace, name))
