"""Whether a set of allocations still fits a node, given its free capacity in a ClusterView."""

from collections.abc import Iterable

from fracgpu.model import GPUAllocation, NodeInventory
from fracgpu.names import CORES_PER_GPU
from fracgpu.placement import ClusterView


def capacity_problem(
    view: ClusterView,
    inventory: NodeInventory | None,
    *,
    allocations: Iterable[GPUAllocation],
    host_free: tuple[int, int],
    cpu_milli: int,
    memory_mib: int,
    split_count: int,
) -> str:
    """Empty when the allocations fit; otherwise what no longer has room."""
    if inventory is None:
        return "the node is not in the cluster (or has no GPU inventory)"
    node = inventory.name
    free_cpu, free_memory = host_free
    if cpu_milli > free_cpu or memory_mib > free_memory:
        return f"node {node} has {free_cpu}m CPU and {free_memory} MiB memory free"
    per_gpu: dict[str, list[GPUAllocation]] = {}
    for alloc in allocations:
        per_gpu.setdefault(alloc.uuid, []).append(alloc)
    devices = {d.uuid: d for d in inventory.devices}
    split = inventory.split_count or split_count
    for uuid, allocs in per_gpu.items():
        device = devices.get(uuid)
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
