"""API objects as the API server returns them, for the kubectl plugin's tests."""

from __future__ import annotations

import uuid
from typing import Any

from fracgpu import codec, names
from fracgpu.model import Assignment, ContainerAssignment, GPUAllocation


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{index}')}"


def gpunode(
    name: str,
    gpus: int = 2,
    *,
    model: str = "NVIDIA A100-SXM4-40GB",
    memory_mib: int = 40960,
    unhealthy: tuple[int, ...] = (),
    reservations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    devices = [
        {
            "uuid": gpu_uuid(name, i),
            "index": i,
            "model": model,
            "memoryMiB": memory_mib,
            "healthy": i not in unhealthy,
        }
        for i in range(gpus)
    ]
    status: dict[str, Any] = {"devices": devices}
    if reservations:
        status["reservations"] = reservations
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPUNODE_KIND,
        "metadata": {"name": name},
        "status": status,
    }


def assigned_pod(
    namespace: str,
    name: str,
    node: str,
    containers: dict[str, list[tuple[int, int, int]]],
    *,
    phase: str = "Pending",
    reservation_id: str | None = None,
) -> dict[str, Any]:
    """A pod as fracgpu admits it; containers: name -> [(gpu index, cores, memory MiB)]."""
    rid = reservation_id or f"r-{namespace}-{name}"
    assignment = Assignment(
        node,
        rid,
        tuple(
            ContainerAssignment(
                container,
                tuple(GPUAllocation(gpu_uuid(node, i), cores, mib) for i, cores, mib in held),
            )
            for container, held in containers.items()
        ),
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "labels": {names.LABEL_MANAGED: "true", names.LABEL_ASSIGNED_NODE: node},
            "annotations": {
                names.ANNOTATION_ASSIGNMENT: codec.encode_assignment(assignment),
                names.ANNOTATION_RESERVATION_ID: rid,
            },
        },
        "spec": {"containers": [{"name": c, "image": "cuda"} for c in containers]},
        "status": {"phase": phase},
    }


def reservation(
    rid: str, namespace: str, pod: str, node: str, *, index: int, cores: int, mib: int
) -> dict[str, Any]:
    return {
        "id": rid,
        "namespace": namespace,
        "pod": pod,
        "expiresAt": "2030-01-01T00:00:00Z",
        "allocations": [{"uuid": gpu_uuid(node, index), "cores": cores, "memoryMiB": mib}],
    }


def gpuquota(
    namespace: str, hard: dict[str, int], used: dict[str, int], **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPUQUOTA_KIND,
        "metadata": {"namespace": namespace, "name": "gpu"},
        "spec": {"hard": hard, **spec},
        "status": {"used": used},
    }
