"""What pods usually look like, learned online from the pods that arrive.

The fragmentation policy needs the workload's typical pod shapes and their frequencies.
Instead of a fixed table, every arriving pod adds to an exponentially decayed histogram of
shapes, so the model follows the workload as it drifts.
"""

import math
from typing import NamedTuple

from fracgpu.model import MemoryRequest
from fracgpu.placement.api import PodDemand

DEFAULT_HALF_LIFE = 2000  # arrivals after which an observation counts half
DEFAULT_COVERAGE = 0.95  # the typical shapes cover this share of the (decayed) arrivals
DEFAULT_MAX_SHAPES = 32
# CPU and memory of a shape are rounded down to 2 ** (k / 2): similar pods pool their
# frequency (so less common big shapes still make the typical set) and fewer shapes are scored.
BUCKETS_PER_DOUBLING = 2
_RESCALE_AT = 1e100


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
    ) -> None:
        if half_life < 1:
            raise ValueError(f"half_life={half_life}: use 1 or more arrivals")
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage={coverage}: use a fraction in (0, 1]")
        if max_shapes < 1:
            raise ValueError(f"max_shapes={max_shapes}: use 1 or more")
        self._growth = 2.0 ** (1.0 / half_life)
        self._coverage = coverage
        self._max_shapes = max_shapes
        self._weights: dict[Shape, float] = {}
        # Rather than decaying every weight per arrival, grow the increment (same ratios).
        self._increment = 1.0
        self.observations = 0

    def observe(self, shape: Shape) -> None:
        self._weights[shape] = self._weights.get(shape, 0.0) + self._increment
        self._increment *= self._growth
        self.observations += 1
        if self._increment > _RESCALE_AT:
            self._rescale()

    def _rescale(self) -> None:
        scale = 1.0 / self._increment
        self._increment = 1.0
        # Shapes whose weight fell below one part in a billion are forgotten.
        self._weights = {s: w * scale for s, w in self._weights.items() if w * scale > 1e-9}

    def typical(self) -> list[tuple[Shape, float]]:
        """The most frequent shapes covering ``coverage`` of the mass, frequencies summing to 1."""
        total = sum(self._weights.values())
        if total <= 0:
            return []
        ranked = sorted(self._weights.items(), key=lambda kv: -kv[1])
        chosen: list[tuple[Shape, float]] = []
        covered = 0.0
        for shape, weight in ranked[: self._max_shapes]:
            chosen.append((shape, weight))
            covered += weight
            if covered >= self._coverage * total:
                break
        return [(s, w / covered) for s, w in chosen]

    def frequency(self, shape: Shape) -> float:
        return self._weights.get(shape, 0.0)
