"""Whether allocations still fit a node now: the re-check both back ends make at reserve.

Everything is read from the ClusterView, which counts admitted pods, open reservations and
claims in flight: the node's inventory, its free CPU and memory, and each GPU's free room.
"""

from collections.abc import Iterable

from fracgpu.model import GPUAllocation
from fracgpu.names import CORES_PER_GPU
from fracgpu.placement import ClusterView


def capacity_problem(
    view: ClusterView,
    node: str,
    allocations: Iterable[GPUAllocation],
    *,
    cpu_milli: int,
    memory_mib: int,
    split_count: int,
) -> str:
    """Empty when the allocations fit; otherwise what no longer has room."""
    inventory = view.inventory(node)
    if inventory is None:
        return f"node {node} offers no GPUs now (no GPU inventory, or marked unschedulable)"
    free_cpu, free_memory = view.node_free(node)
    if cpu_milli > free_cpu or memory_mib > free_memory:
        return f"node {node} has {free_cpu}m CPU and {free_memory} MiB memory free"
    per_gpu: dict[str, list[GPUAllocation]] = {}
    for alloc in allocations:
        per_gpu.setdefault(alloc.uuid, []).append(alloc)
    split = inventory.split_count or split_count
    for uuid, allocs in per_gpu.items():
        device = next((d for d in inventory.devices if d.uuid == uuid), None)
        if device is None or not device.shareable:
            return f"GPU {uuid} is not a usable GPU on node {node}"
        free_cores, free_gpu_memory, count = view.gpu_free(node, uuid)
        exclusive = any(a.cores >= CORES_PER_GPU for a in allocs)
        if (
            sum(a.cores for a in allocs) > free_cores
            or sum(a.memory_mib for a in allocs) > free_gpu_memory
            or count + len(allocs) > split
            or (exclusive and (count > 0 or len(allocs) > 1))
        ):
            return (
                f"GPU {uuid} on {node} has {free_cores} cores and {free_gpu_memory} MiB free "
                f"with {count} of {split} slices taken"
            )
    return ""
