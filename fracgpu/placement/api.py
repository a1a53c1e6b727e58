"""The placement vocabulary: what is asked (PodDemand) and what comes back (Placement | NoFit)."""

from dataclasses import dataclass, field
from enum import StrEnum

from fracgpu.model import ContainerAssignment, ContainerRequest, GPUDevice


class Policy(StrEnum):
    """How to choose among the GPUs that fit.

    BINPACK fills the fullest node and GPU first, SPREAD the emptiest; BEST_FIT picks the node
    with the least CPU + memory + GPU left (the baseline of the FGD paper); FRAGMENTATION picks
    the GPU whose use loses the least capacity for the workload's typical pod shapes; FGD is the
    FGD paper's own rule (Weng et al., ATC'23), kept to compare against.
    """

    BINPACK = "binpack"
    SPREAD = "spread"
    FRAGMENTATION = "fragmentation"
    BEST_FIT = "best-fit"
    FGD = "fgd"


@dataclass(frozen=True, slots=True)
class Constraints:
    """Where a pod may go.

    Model names match case-insensitively as substrings ("A100" matches "NVIDIA A100-SXM4-80GB"),
    or as whole names when ``exact_models`` is set (trace replays: "V100M16" != "V100M16X").
    ``nodes`` is the set of nodes the pod's own nodeSelector, required node affinity and
    tolerations allow (None: any node). Placement turns each distinct ``Constraints`` into a
    mask of eligible GPUs once (``CandidateFinder.allowed``), so a large node set or UUID list
    costs set look-ups once, not per decision.
    """

    include_models: tuple[str, ...] = ()
    exclude_models: tuple[str, ...] = ()
    include_uuids: tuple[str, ...] = ()
    exclude_uuids: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()  # allowed node pools; empty = any
    exact_models: bool = False
    nodes: frozenset[str] | None = None
    # The UUID lists as sets, for look-ups (built once per Constraints, not per GPU).
    _include: frozenset[str] = field(init=False, repr=False, compare=False, hash=False)
    _exclude: frozenset[str] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_include", frozenset(self.include_uuids))
        object.__setattr__(self, "_exclude", frozenset(self.exclude_uuids))

    def allows(self, device: GPUDevice) -> bool:
        """The GPU's model and UUID are allowed (the node is checked by ``allows_node``)."""
        if not self.allows_model(device.model):
            return False
        return self.allows_uuid(device.uuid)

    def allows_uuid(self, uuid: str) -> bool:
        if self.include_uuids and uuid not in self._include:
            return False
        return uuid not in self._exclude

    def allows_node(self, node: str) -> bool:
        return self.nodes is None or node in self.nodes

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
    # NOT_NOW only because the nodes with room are held for wider pods (``ClusterView.held_from``).
    held: bool = False
