"""The placement vocabulary: what is asked (PodDemand) and what comes back (Placement | NoFit)."""

from dataclasses import dataclass
from enum import StrEnum

from fracgpu.model import ContainerAssignment, ContainerRequest, GPUDevice


class Policy(StrEnum):
    """How to choose among the GPUs that fit.

    BINPACK fills the fullest node and GPU first, SPREAD the emptiest; BEST_FIT picks the node
    with the least CPU + memory + GPU left (the baseline of the FGD paper); FRAGMENTATION picks
    the GPU whose use loses the least capacity for the workload's typical pod shapes.
    """

    BINPACK = "binpack"
    SPREAD = "spread"
    FRAGMENTATION = "fragmentation"
    BEST_FIT = "best-fit"


@dataclass(frozen=True, slots=True)
class Constraints:
    """Where a pod may go.

    Model names match case-insensitively as substrings ("A100" matches "NVIDIA A100-SXM4-80GB"),
    or as whole names when ``exact_models`` is set (trace replays: "V100M16" != "V100M16X").
    """

    include_models: tuple[str, ...] = ()
    exclude_models: tuple[str, ...] = ()
    include_uuids: tuple[str, ...] = ()
    exclude_uuids: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()  # allowed node pools; empty = any
    exact_models: bool = False
    # False when ``include_uuids`` only lists the GPUs of the nodes a pod's nodeSelector,
    # affinity and tolerations allow (the pod named no GPU): messages then do not claim it did.
    uuids_named: bool = True

    def allows(self, device: GPUDevice) -> bool:
        if not self.allows_model(device.model):
            return False
        if self.include_uuids and device.uuid not in self.include_uuids:
            return False
        return device.uuid not in self.exclude_uuids

    def allows_model(self, model: str) -> bool:
        name = model.lower()
        if self.include_models and not any(self._matches(m, name) for m in self.include_models):
            return False
        return not any(self._matches(m, name) for m in self.exclude_models)

    def _matches(self, wanted: str, model_lower: str) -> bool:
        wanted = wanted.lower()
        return wanted == model_lower if self.exact_models else wanted in model_lower

    def allows_pool(self, pool: str) -> bool:
        return not self.pools or pool in self.pools


@dataclass(frozen=True, slots=True)
class PodDemand:
    """A pod's GPU containers plus the CPU and memory the node must also have free."""

    containers: tuple[ContainerRequest, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    constraints: Constraints = Constraints()


@dataclass(frozen=True, slots=True)
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
