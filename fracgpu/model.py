"""The data model: frozen values that every component passes around.

Units: compute in cores (100 = one whole GPU), memory in MiB. Nothing here does I/O.
The values admission builds for every pod have slots: a frozen dataclass with slots is
built in about two thirds of the time of one without.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TypeVar

from fracgpu.names import CORES_PER_GPU, MEMORY_BLOCK_MIB

_V = TypeVar("_V")


class Dialect(StrEnum):
    """Which resource vocabulary a container used to ask for GPUs."""

    TKESTACK = "tkestack"
    HAMI = "hami"
    GPUSHARE = "gpushare"


class Priority(StrEnum):
    """Compute priority when containers share a GPU (HAMi: 0 high, 1 low)."""

    HIGH = "high"
    LOW = "low"


@dataclass(frozen=True)
class GPUDevice:
    """One physical GPU on a node, as the node agent discovered it."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    healthy: bool = True
    mig_enabled: bool = False
    pci_bus_id: str = ""

    @property
    def shareable(self) -> bool:
        """MIG GPUs are reported but left alone (HAMi's migStrategy "none")."""
        return self.healthy and not self.mig_enabled


def virtual_memory_mib(physical_mib: int, memory_scaling: float) -> int:
    """GPU memory a card offers with memory scaling: physical x factor, in whole MiB."""
    return int(physical_mib * memory_scaling)


@dataclass(frozen=True)
class NodeInventory:
    """A GPU node: its GPUs plus the CPU and memory a pinned pod also needs."""

    name: str
    devices: tuple[GPUDevice, ...]
    cpu_milli: int
    memory_mib: int
    pool: str = ""
    # Maximum containers on one GPU (HAMi deviceSplitCount); None = the cluster default.
    split_count: int | None = None
    # Virtual GPU memory = physical x this (HAMi deviceMemoryScaling); None = cluster default.
    memory_scaling: float | None = None
    # Whether the shim paces compute here (HAMi disablecorelimit inverted); None = default.
    compute_limit: bool | None = None


@dataclass(frozen=True, slots=True)
class MemoryRequest:
    """Memory per GPU: an exact MiB amount, or a percentage resolved when a GPU is chosen."""

    mib: int | None = None
    percent: int | None = None

    def __post_init__(self) -> None:
        if (self.mib is None) == (self.percent is None):
            raise ValueError("MemoryRequest needs exactly one of mib or percent")

    def resolve(self, card_memory_mib: int) -> int:
        """MiB to reserve on a card of this size (whole blocks, the full card at 100 %)."""
        if self.mib is not None:
            return self.mib
        assert self.percent is not None
        if self.percent >= 100:
            return card_memory_mib
        blocks = card_memory_mib * self.percent // (100 * MEMORY_BLOCK_MIB)
        return max(1, blocks) * MEMORY_BLOCK_MIB


WHOLE_CARD = MemoryRequest(percent=100)


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container's GPU ask in canonical terms: gpus x (cores, memory) per GPU.

    ``cores`` is 1..100 per GPU, 100 meaning the GPU is the container's alone; 0 means
    best effort (no compute reserved and none limited), which only a configured default gives.
    """

    container: str
    gpus: int
    cores: int
    memory: MemoryRequest
    dialect: Dialect = Dialect.TKESTACK
    # Elastic upper bound on compute (TKEStack vcuda-core-limit); None = same as cores.
    core_limit: int | None = None
    # This container's own priority (HAMi's nvidia.com/priority limit); None = the pod's.
    priority: Priority | None = None

    @property
    def exclusive(self) -> bool:
        return self.cores >= CORES_PER_GPU


@dataclass(frozen=True, slots=True)
class GPUAllocation:
    """What one container holds on one GPU."""

    uuid: str
    cores: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class ContainerAssignment:
    container: str
    devices: tuple[GPUAllocation, ...]
    # Elastic compute bound per GPU (TKEStack vcuda-core-limit); None = the cores held.
    core_limit: int | None = None
    # The container's own priority; None = the pod's priority annotations decide.
    priority: Priority | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    """The webhook's decision for a pod, written into the pod's annotation."""

    node: str
    reservation_id: str
    containers: tuple[ContainerAssignment, ...]
    # The node's settings when the pod was placed, so the agent applies what placement assumed.
    memory_scaling: float = 1.0
    compute_limit: bool = True

    def allocations(self) -> tuple[GPUAllocation, ...]:
        return tuple(dev for c in self.containers for dev in c.devices)

    def for_container(self, name: str) -> ContainerAssignment | None:
        return next((c for c in self.containers if c.container == name), None)


@dataclass(frozen=True, slots=True)
class Reservation:
    """A slice held between admission and the pod appearing in the watch cache."""

    id: str
    node: str
    namespace: str
    pod: str
    allocations: tuple[GPUAllocation, ...]
    expires_at: int  # unix seconds


@dataclass(frozen=True)
class ResourceAmounts:
    """Amounts counted by quota: cores (100 per GPU), memory MiB, whole GPUs."""

    cores: int = 0
    memory_mib: int = 0
    gpus: int = 0

    def __add__(self, other: "ResourceAmounts") -> "ResourceAmounts":
        return ResourceAmounts(
            self.cores + other.cores, self.memory_mib + other.memory_mib, self.gpus + other.gpus
        )

    def __sub__(self, other: "ResourceAmounts") -> "ResourceAmounts":
        return ResourceAmounts(
            self.cores - other.cores, self.memory_mib - other.memory_mib, self.gpus - other.gpus
        )

    def clamp_at_zero(self) -> "ResourceAmounts":
        return ResourceAmounts(max(0, self.cores), max(0, self.memory_mib), max(0, self.gpus))


@dataclass(frozen=True)
class ResourceLimits:
    """Hard limits; None means that dimension is not limited."""

    cores: int | None = None
    memory_mib: int | None = None
    gpus: int | None = None


def _frozen_mapping(value: Mapping[str, _V]) -> Mapping[str, _V]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class Grants:
    """Rights an administrator grants a namespace in a GPUQuota's spec; default: none.

    ``priority``: the highest compute priority the namespace's pods may ask for (LOW, the
    default, grants nothing above the default). ``privileged``: GPU pods may run privileged
    containers (or add capabilities that undo the shim's mounts)."""

    priority: Priority = Priority.LOW
    privileged: bool = False


@dataclass(frozen=True)
class Quota:
    """A namespace's GPUQuota: hard limits (whole namespace, per model, allowed pools) and use."""

    namespace: str
    name: str
    hard: ResourceLimits = ResourceLimits()
    hard_by_model: Mapping[str, ResourceLimits] = field(default_factory=dict)
    pools: tuple[str, ...] = ()
    used: ResourceAmounts = ResourceAmounts()
    used_by_model: Mapping[str, ResourceAmounts] = field(default_factory=dict)
    resource_version: str = ""
    # What an administrator granted the namespace (spec.grants); tenants cannot write it.
    grants: Grants = Grants()

    def __post_init__(self) -> None:
        object.__setattr__(self, "hard_by_model", _frozen_mapping(self.hard_by_model))
        object.__setattr__(self, "used_by_model", _frozen_mapping(self.used_by_model))


@dataclass(frozen=True)
class UsageSample:
    """One container's use of one GPU, read from the shim's accounting region."""

    namespace: str
    pod: str
    container: str
    uuid: str
    memory_used_bytes: int
    memory_limit_bytes: int
    core_limit: int
    utilization_ratio: float
    oom_rejections: int
    timestamp: float
    # The part of memory_used_bytes the shim served from host memory (host fallback).
    memory_host_bytes: int = 0
