"""Discover the node's GPUs through NVML and describe them in the core model."""

from dataclasses import dataclass

from agent.nvml_backend import NvmlBackend
from fracgpu.model import GPUDevice

MIB = 1024 * 1024


@dataclass(frozen=True)
class NodeGPUs:
    """What the agent found on this node: the GPUs plus the driver they run on."""

    devices: tuple[GPUDevice, ...]
    driver_version: str
    cuda_driver_version: str

    def by_uuid(self) -> dict[str, GPUDevice]:
        return {d.uuid: d for d in self.devices}


def discover(backend: NvmlBackend) -> NodeGPUs:
    """Every GPU NVML reports, in index order. NVML failures propagate as NvmlError."""
    devices = []
    for index in range(backend.device_count()):
        info = backend.device_info(index)
        devices.append(
            GPUDevice(
                uuid=info.uuid,
                index=info.index,
                model=info.name,
                memory_mib=info.memory_total_bytes // MIB,
                healthy=True,
                mig_enabled=info.mig_enabled,
                pci_bus_id=info.pci_bus_id,
            )
        )
    return NodeGPUs(
        devices=tuple(devices),
        driver_version=backend.driver_version(),
        cuda_driver_version=backend.cuda_driver_version(),
    )
