"""Writes to shared state, each guarded by the resourceVersion the decision was made on.

A merge patch that carries ``metadata.resourceVersion`` is applied only if the object is still
at that version; otherwise the API server answers 409 and the caller re-reads and re-decides.
"""

from collections.abc import Iterable
from typing import Any

from fracgpu import codec
from fracgpu.model import Quota, Reservation
from webhook.cluster import paths
from webhook.cluster.apiclient import KubeApi, Obj


async def write_reservations(
    api: KubeApi, node: str, resource_version: str, reservations: Iterable[Reservation]
) -> Obj:
    """Replace a GPUNode's reservations, if it is still at ``resource_version``."""
    body = {
        "metadata": {"resourceVersion": resource_version},
        "status": {"reservations": [codec.encode_reservation(r) for r in reservations]},
    }
    return await api.patch(paths.gpunode_status(node), body)


async def write_allocation_summary(
    api: KubeApi,
    node: str,
    resource_version: str,
    allocated: list[dict[str, Any]],
    summary: dict[str, Any],
) -> Obj:
    body = {
        "metadata": {"resourceVersion": resource_version},
        "status": {"allocated": allocated, "summary": summary},
    }
    return await api.patch(paths.gpunode_status(node), body)


async def write_quota_used(api: KubeApi, quota: Quota) -> Obj:
    """Store a quota's used amounts, if it is still at the version it was read at."""
    body = {
        "metadata": {"resourceVersion": quota.resource_version},
        "status": codec.encode_quota_status(quota),
    }
    return await api.patch(paths.gpuquota_status(quota.namespace, quota.name), body)
