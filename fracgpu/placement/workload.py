"""What pods usually look like, learned online from the pods that arrive.

The fragmentation policy needs the workload's typical pod shapes and their frequencies.
Instead of a fixed table, every arriving pod adds to an exponentially decayed histogram of
shapes, so the model follows the workload as it drifts.
"""

import heapq
import math
from operator import itemgetter
from typing import NamedTuple

from fracgpu.model import MemoryRequest
from fracgpu.placement.api import PodDemand

DEFAULT_HALF_LIFE = 2000  # arrivals after which an observation counts half
DEFAULT_COVERAGE = 0.95  # the typical shapes cover this share of the (decayed) arrivals
DEFAULT_MAX_SHAPES = 32
# Past ``max_shapes``, up to this many more typical shapes when they are limited to GPU models.
# Such pods split into many shapes: on the openb trace with its production model limits
# (gpuspec33: a third of the GPU pods, more than half of those asking for T4), 32 shapes left
# most T4-only shapes out, so pods that could run anywhere filled the T4s and T4-only pods were
# refused (benchmarks.md, fourteenth session). Only limited shapes get the extra room: a cap of
# 64 for all shapes did as well there but scored twice the shapes on the default trace (decision
# p99 1.2 -> 2.7 ms, past the 2 ms target), where no pod is limited.
DEFAULT_MAX_LIMITED_EXTRA = 32
# ...each with at least this share of the (decayed) arrivals: a tenant's one-off pods with a
# made-up model list do not take that room (with no floor, 40 such pods once each filled it).
LIMITED_MIN_SHARE = 1e-3
# The most distinct shapes a model remembers: tenants choose shapes (GPU memory, CPU, model
# names), so memory must not grow with what they send. Real workloads have far fewer (the
# openb trace: 90 shapes, 91 FGD task types). Past twice this many, the lowest-weight shapes
# are forgotten down to it, so the pruning's cost is spread over as many new shapes.
DEFAULT_MAX_TRACKED = 1024
# CPU and memory of a shape are rounded down to 2 ** (k / 2): similar pods pool their
# frequency (so less common big shapes still make the typical set) and fewer shapes are scored.
BUCKETS_PER_DOUBLING = 2
_RESCALE_AT = 1e100
# Multi-GPU shapes with at least this share of the (decayed) arrivals are typical
# even beyond the coverage cut, at most this many of them.
WIDE_MIN_SHARE = 1e-3
MAX_WIDE_SHAPES = 8


class Shape(NamedTuple):
    """A pod's shape as far as fitting goes: one GPU container kind plus node CPU/memory.

    A named tuple, not a dataclass: one is built and hashed twice for every arriving pod, and
    a tuple is built and hashed in C."""

    units: int  # compute units per GPU (the view's unit)
    gpus: int
    memory: MemoryRequest  # GPU memory per GPU
    cpu_milli: int
    memory_mib: int
    include_models: tuple[str, ...] = ()
    exclude_models: tuple[str, ...] = ()
    exact_models: bool = False

    def allows_model(self, model: str) -> bool:
        name = model.lower()

        def matches(wanted: str) -> bool:
            w = wanted.lower()
            return w == name if self.exact_models else w in name

        if self.include_models and not any(matches(m) for m in self.include_models):
            return False
        return not any(matches(m) for m in self.exclude_models)


def bucket(amount: int) -> int:
    """The largest 2 ** (k / BUCKETS_PER_DOUBLING) not above ``amount`` (0 stays 0)."""
    if amount <= 0:
        return 0
    k = math.floor(math.log2(amount) * BUCKETS_PER_DOUBLING + 1e-9)
    return min(amount, math.floor(2 ** (k / BUCKETS_PER_DOUBLING)))


def shape_of(demand: PodDemand) -> Shape | None:
    """The demand's shape; multi-container pods are described by their biggest container."""
    if not demand.containers:
        return None
    containers = demand.containers
    biggest = (
        containers[0]
        if len(containers) == 1
        else max(containers, key=lambda c: (c.gpus * c.cores, c.gpus))
    )
    c = demand.constraints
    return Shape(
        units=biggest.cores,
        gpus=biggest.gpus,
        memory=biggest.memory,
        cpu_milli=bucket(demand.cpu_milli),
        memory_mib=bucket(demand.memory_mib),
        include_models=c.include_models,
        exclude_models=c.exclude_models,
        exact_models=c.exact_models,
    )


class WorkloadModel:
    """Exponentially decayed frequencies of observed shapes."""

    def __init__(
        self,
        half_life: int = DEFAULT_HALF_LIFE,
        coverage: float = DEFAULT_COVERAGE,
        max_shapes: int = DEFAULT_MAX_SHAPES,
        *,
        max_limited_extra: int = DEFAULT_MAX_LIMITED_EXTRA,
        keep_wide: bool = True,
        max_tracked: int = DEFAULT_MAX_TRACKED,
    ) -> None:
        if half_life < 1:
            raise ValueError(f"half_life={half_life}: use 1 or more arrivals")
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage={coverage}: use a fraction in (0, 1]")
        if max_shapes < 1:
            raise ValueError(f"max_shapes={max_shapes}: use 1 or more")
        if max_limited_extra < 0:
            raise ValueError(f"max_limited_extra={max_limited_extra}: use 0 or more")
        if max_tracked < 1:
            raise ValueError(f"max_tracked={max_tracked}: use 1 or more")
        self._growth: float = 2.0 ** (1.0 / half_life)
        self._coverage = coverage
        self._max_shapes = max_shapes
        self._max_limited_extra = max_limited_extra
        self._keep_wide = keep_wide
        self._max_tracked = max_tracked
        self._prune_above = 2 * max_tracked
        self._weights: dict[Shape, float] = {}
        # Per shape, the most CPU and host memory any of its pods asked (shapes round down).
        self._largest: dict[Shape, tuple[int, int]] = {}
        # Rather than decaying every weight per arrival, grow the increment (same ratios).
        self._increment = 1.0
        self.observations = 0

    def observe(self, shape: Shape, cpu_milli: int = 0, memory_mib: int = 0) -> None:
        """Count one arrival of ``shape``; the pod asked ``cpu_milli`` and ``memory_mib``
        (``shape`` holds them rounded down). Every pod counts once, whatever its GPU count:
        weighing a pod of g GPUs by the root of g (as until the sixteenth session) kept whole
        nodes when nothing else did, and cost allocation on every trace once the kept hosts,
        their ranks and the hold did (benchmarks.md)."""
        self._weights[shape] = self._weights.get(shape, 0.0) + self._increment
        largest = self._largest.get(shape)
        if largest is None or cpu_milli > largest[0] or memory_mib > largest[1]:
            old = largest or (0, 0)
            self._largest[shape] = (max(old[0], cpu_milli), max(old[1], memory_mib))
        self._increment *= self._growth
        self.observations += 1
        if self._increment > _RESCALE_AT:
            self._rescale()
        # A new shape (``_largest`` holds the same shapes as ``_weights``): maybe too many.
        if largest is None and len(self._weights) > self._prune_above:
            self._prune()

    def _rescale(self) -> None:
        scale = 1.0 / self._increment
        self._increment = 1.0
        # Shapes whose weight fell below one part in a billion are forgotten.
        self._weights = {s: w * scale for s, w in self._weights.items() if w * scale > 1e-9}
        self._largest = {s: v for s, v in self._largest.items() if s in self._weights}

    def _prune(self) -> None:
        """Keep the ``max_tracked`` heaviest shapes, forgetting the rest (weights are on one
        scale, so the heaviest are the most frequent after decay)."""
        kept = heapq.nlargest(self._max_tracked, self._weights.items(), key=itemgetter(1))
        self._weights = dict(kept)
        self._largest = {s: v for s, v in self._largest.items() if s in self._weights}

    def typical(self) -> list[tuple[Shape, float]]:
        """The most frequent shapes covering ``coverage`` of the mass, at most ``max_shapes``
        and then ``max_limited_extra`` limited to models (plus the multi-GPU ones
        that are not negligible, when ``keep_wide``), frequencies summing to 1. Each shape
        asks the most CPU and memory that one of its pods asked."""
        total = sum(self._weights.values())
        if total <= 0:
            return []
        ranked = sorted(self._weights.items(), key=lambda kv: -kv[1])
        chosen: list[tuple[Shape, float]] = []
        covered = 0.0
        extra = 0
        for shape, weight in ranked:
            if len(chosen) >= self._max_shapes:
                # Ranked by weight: past the floor, so are all the rest.
                if extra >= self._max_limited_extra or weight < LIMITED_MIN_SHARE * total:
                    break
                if not (shape.include_models or shape.exclude_models):
                    continue
                extra += 1
            chosen.append((shape, weight))
            covered += weight
            if covered >= self._coverage * total:
                break
        if self._keep_wide:
            # Multi-GPU shapes stay typical while they are not negligible, even past the
            # coverage cut: they are the ones whose room breaks up unseen.
            taken = {s for s, _ in chosen}
            wide = [
                (s, w)
                for s, w in ranked
                if s.gpus > 1 and s not in taken and w >= WIDE_MIN_SHARE * total
            ][:MAX_WIDE_SHAPES]
            chosen += wide
            covered += sum(w for _, w in wide)
        return [(self._needs(s), w / covered) for s, w in chosen]

    def _needs(self, shape: Shape) -> Shape:
        """The shape with the most CPU and memory its pods asked: rounded down, a node with
        88 CPUs free would look able to host 8-GPU pods of 88 CPUs once it has 65 left."""
        cpu, memory = self._largest.get(shape, (0, 0))
        return shape._replace(
            cpu_milli=max(cpu, shape.cpu_milli), memory_mib=max(memory, shape.memory_mib)
        )

    def effective_observations(self) -> float:
        """How many arrivals the decayed frequencies rest on: an arrival ``age`` arrivals ago
        counts 2 ** (-age / half_life), so this tends to half_life / ln 2 (about 2,900 at the
        default) and a shape's frequency is known to within its sampling error over as many."""
        step = 1.0 / self._growth
        return (1.0 - math.pow(step, self.observations)) / (1.0 - step)

    def frequency(self, shape: Shape) -> float:
        return self._weights.get(shape, 0.0)
