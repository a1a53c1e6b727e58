"""Small hand-checkable clusters and demands for the placement tests."""

from fracgpu.model import (
    WHOLE_CARD,
    ContainerRequest,
    GPUAllocation,
    GPUDevice,
    MemoryRequest,
    NodeInventory,
)
from fracgpu.placement import ClusterView, Constraints, Placement, PodDemand
from fracgpu.placement.fragmentation import HELD_WHOLE_NODES

CARD_MIB = 16384
ANYWHERE = Constraints()


def node(
    name: str,
    gpus: int,
    *,
    model: str = "Tesla T4",
    memory_mib: int = CARD_MIB,
    cpu_milli: int = 32000,
    host_memory_mib: int = 131072,
    pool: str = "",
    split_count: int | None = None,
    unhealthy: tuple[int, ...] = (),
    mig: tuple[int, ...] = (),
) -> NodeInventory:
    devices = tuple(
        GPUDevice(
            uuid=f"{name}-gpu{i}",
            index=i,
            model=model,
            memory_mib=memory_mib,
            healthy=i not in unhealthy,
            mig_enabled=i in mig,
        )
        for i in range(gpus)
    )
    return NodeInventory(name, devices, cpu_milli, host_memory_mib, pool, split_count)


def share(
    cores: int,
    memory_mib: int = 1024,
    *,
    gpus: int = 1,
    name: str = "main",
    cpu_milli: int = 0,
    host_memory_mib: int = 0,
    constraints: Constraints = ANYWHERE,
) -> PodDemand:
    request = ContainerRequest(name, gpus, cores, MemoryRequest(mib=memory_mib))
    return PodDemand((request,), cpu_milli, host_memory_mib, constraints)


def container(name: str, cores: int, memory: MemoryRequest, gpus: int = 1) -> ContainerRequest:
    return ContainerRequest(name, gpus, cores, memory)


def uuids(placement: Placement) -> list[str]:
    return [a.uuid for c in placement.containers for a in c.devices]


def allocations(placement: Placement) -> list[GPUAllocation]:
    return [a for c in placement.containers for a in c.devices]


def reserve_cluster(held_whole_nodes: int = HELD_WHOLE_NODES) -> ClusterView:
    """One node of 128 CPUs, the only one its kind; two of 96 CPUs, covered by all three.
    One-GPU pods of 4 CPUs are the usual shape; some pods take a node's 8 GPUs."""
    big = node("big", 8, cpu_milli=128000, host_memory_mib=786432)
    small = [node(f"s{i}", 8, cpu_milli=96000, host_memory_mib=393216) for i in (1, 2)]
    view = ClusterView([big, *small], held_whole_nodes=held_whole_nodes)
    for _ in range(5):
        view.observe(PodDemand((container("main", 100, WHOLE_CARD, gpus=8),), cpu_milli=88000))
    for _ in range(100):
        view.observe(PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=4000))
    return view
