"""The placement vocabulary: what is asked (PodDemand) and what comes back (Placement | NoFit)."""

from dataclasses import dataclass
from enum import StrEnum

from fracgpu.model import ContainerAssignment, ContainerRequest, GPUDevice


class Policy(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"
    FRAGMENTATION = "fragmentation"


@dataclass(frozen=True)
class Constraints:
    """Where a pod may go. Model names match case-insensitively as substrings ("A100")."""

    include_models: tuple[str, ...] = ()
    exclude_models: tuple[str, ...] = ()
    include_uuids: tuple[str, ...] = ()
    exclude_uuids: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()  # allowed node pools; empty = any

    def allows(self, device: GPUDevice) -> bool:
        model = device.model.lower()
        if self.include_models and not any(m.lower() in model for m in self.include_models):
            return False
        if any(m.lower() in model for m in self.exclude_models):
            return False
        if self.include_uuids and device.uuid not in self.include_uuids:
            return False
        return device.uuid not in self.exclude_uuids

    def allows_pool(self, pool: str) -> bool:
        return not self.pools or pool in self.pools


@dataclass(frozen=True)
class PodDemand:
    """A pod's GPU containers plus the CPU and memory the node must also have free."""

    containers: tuple[ContainerRequest, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    constraints: Constraints = Constraints()


@dataclass(frozen=True)
class Placement:
    node: str
    containers: tuple[ContainerAssignment, ...]


class NoFitReason(StrEnum):
    NEVER = "never"  # no GPU in the cluster could hold it even when empty
    NOT_NOW = "not-now"  # some GPU could, but none has room now


@dataclass(frozen=True)
class NoFit:
    reason: NoFitReason
    message: str
