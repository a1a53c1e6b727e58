"""Whether allocations chosen earlier still fit a node now: the re-check made at reserve time,
with the fit rule placement itself uses (``fit.gpu_room``)."""

from collections.abc import Iterable

from fracgpu.model import GPUAllocation
from fracgpu.placement.fit import gpu_room, host_room
from fracgpu.placement.state import ClusterState


def capacity_problem(
    state: ClusterState,
    node: str,
    allocations: Iterable[GPUAllocation],
    *,
    cpu_milli: int,
    memory_mib: int,
) -> str:
    """Empty when the allocations fit on ``node`` now; otherwise what no longer has room."""
    inventory = state.inventory(node)
    if inventory is None:
        return f"node {node} offers no GPUs now (no GPU inventory, or marked unschedulable)"
    row = state.row(node)
    free_cpu, free_memory = int(state.n_cpu_free[row]), int(state.n_mem_free[row])
    if not host_room(free_cpu, free_memory, cpu_milli=cpu_milli, memory_mib=memory_mib):
        return f"node {node} has {free_cpu}m CPU and {free_memory} MiB memory free"
    per_gpu: dict[str, list[GPUAllocation]] = {}
    for alloc in allocations:
        per_gpu.setdefault(alloc.uuid, []).append(alloc)
    units = state.gpu_units
    for uuid, allocs in per_gpu.items():
        device = next((d for d in inventory.devices if d.uuid == uuid), None)
        if device is None or not device.shareable:
            return f"GPU {uuid} is not a usable GPU on node {node}"
        slot = state.slot(node, uuid)
        free, memory_free, count = (
            int(state.g_free[slot]),
            int(state.g_mem_free[slot]),
            int(state.g_cont[slot]),
        )
        exclusive = any(a.cores >= units for a in allocs)
        cores = sum(a.cores for a in allocs)
        room = gpu_room(
            free,
            memory_free,
            count,
            int(state.g_mem_total[slot]),
            int(state.g_split[slot]),
            cores=max(cores, units) if exclusive else min(cores, units - 1),
            memory=sum(a.memory_mib for a in allocs),
            units=units,
            taking=len(allocs),
        )
        if not room or cores > free:
            return (
                f"GPU {uuid} on {node} has {free} cores and {memory_free} MiB free "
                f"with {count} of {int(state.g_split[slot])} slices taken"
            )
    return ""
