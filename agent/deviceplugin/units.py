"""The device IDs each canonical resource advertises to kubelet.

Kubelet counts extended resources in whole devices, so one GPU becomes 100 compute IDs
(``<uuid>-core-<n>``) and one memory ID per full 256 MiB block (``<uuid>-mem-<n>``). The
IDs are accounting tokens: which GPU a container really uses comes from the pod's
assignment, but an unhealthy GPU's IDs are reported Unhealthy so kubelet stops counting
them.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from fracgpu.model import GPUDevice, virtual_memory_mib
from fracgpu.names import CORES_PER_GPU, MEMORY_BLOCK_MIB


class ResourceKind(StrEnum):
    COMPUTE = "core"
    MEMORY = "mem"


@dataclass(frozen=True)
class Unit:
    id: str
    uuid: str
    healthy: bool


def units_per_gpu(kind: ResourceKind, device: GPUDevice, memory_scaling: float = 1.0) -> int:
    """Compute IDs per GPU, or memory IDs: blocks of the memory offered (physical x scaling)."""
    if kind is ResourceKind.COMPUTE:
        return CORES_PER_GPU
    return virtual_memory_mib(device.memory_mib, memory_scaling) // MEMORY_BLOCK_MIB


def unit_id(kind: ResourceKind, uuid: str, n: int) -> str:
    return f"{uuid}-{kind.value}-{n}"


def gpu_of(kind: ResourceKind, device_id: str) -> str | None:
    """The GPU UUID a device ID belongs to, or None when it is not one of ours."""
    marker = f"-{kind.value}-"
    uuid, sep, n = device_id.rpartition(marker)
    if not sep or not uuid or not n.isdigit():
        return None
    return uuid


def advertised_units(
    kind: ResourceKind,
    devices: Iterable[GPUDevice],
    health: dict[str, bool],
    memory_scaling: float = 1.0,
) -> list[Unit]:
    """All IDs for this resource; MIG GPUs are left out (fracgpu does not share them)."""
    units: list[Unit] = []
    for device in devices:
        if device.mig_enabled:
            continue
        healthy = health.get(device.uuid, device.healthy)
        units.extend(
            Unit(unit_id(kind, device.uuid, n), device.uuid, healthy)
            for n in range(units_per_gpu(kind, device, memory_scaling))
        )
    return units


def preferred(
    kind: ResourceKind, available: list[str], must_include: list[str], size: int
) -> list[str]:
    """Pick ``size`` IDs: the required ones, then as few GPUs as possible (fullest first).

    Packing keeps the tokens of other GPUs whole, matching the webhook's binpack default;
    ties go to the lower UUID so the answer is deterministic.
    """
    chosen = list(dict.fromkeys(must_include))[:size]
    taken = set(chosen)
    by_gpu: dict[str, list[str]] = {}
    for device_id in available:
        if device_id in taken:
            continue
        by_gpu.setdefault(gpu_of(kind, device_id) or "", []).append(device_id)
    touched = {gpu_of(kind, d) or "" for d in chosen}
    order = sorted(by_gpu, key=lambda g: (g not in touched, len(by_gpu[g]), g))
    for gpu in order:
        for device_id in sorted(by_gpu[gpu], key=_natural):
            if len(chosen) >= size:
                return chosen
            chosen.append(device_id)
    return chosen


def _natural(device_id: str) -> tuple[str, int]:
    head, _, n = device_id.rpartition("-")
    return (head, int(n) if n.isdigit() else -1)
