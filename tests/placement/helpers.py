"""Small hand-checkable clusters and demands for the placement tests."""

from fracgpu.model import ContainerRequest, GPUAllocation, GPUDevice, MemoryRequest, NodeInventory
from fracgpu.placement import Constraints, Placement, PodDemand

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
