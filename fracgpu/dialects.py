"""Read a container's GPU resources in any supported dialect into one ``ContainerRequest``.

Dialects (resource names configurable through ``ResourceNames``):

- TKEStack: ``vcuda-core`` (1..99 = share of one GPU, N x 100 = N whole GPUs) and
  ``vcuda-memory`` (256 MiB blocks for the container), optional ``vcuda-core-limit``.
- HAMi: ``nvidia.com/gpu`` (GPUs), per GPU ``gpumem`` (MiB) or ``gpumem-percentage``,
  and ``gpucores`` (percent).
- gpushare: ``aliyun.com/gpu-mem`` (GiB by default) and ``aliyun.com/gpu-count``.

Kubernetes does not overcommit extended resources, so a request must equal its limit.
"""

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from types import MappingProxyType
from typing import Final, NoReturn

from fracgpu import names
from fracgpu.errors import FracgpuError, QuantityError, RequestError
from fracgpu.model import (
    WHOLE_CARD,
    ContainerAssignment,
    ContainerRequest,
    Dialect,
    MemoryRequest,
    Priority,
)
from fracgpu.quantity import format_count, parse_count, shown

# Sanity caps: larger values are typos or attacks, never real hardware.
MAX_GPUS_PER_CONTAINER: Final = 64
MAX_MEMORY_MIB: Final = 16 * 1024 * 1024
_MAX_BLOCKS: Final = MAX_MEMORY_MIB // names.MEMORY_BLOCK_MIB


# Resource names that look like a dialect's GPU resources, by domain: the name, without
# '-', '_' and '.', starts with one of these (fracgpu.io: every name). A key of this shape
# that is not configured is refused (``ResourceNames.near_miss``). Other plugins' names
# do not match: NVIDIA's (nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb), Alibaba cGPU's
# (aliyun.com/gpu-core.percentage).
GPU_LOOKALIKES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "tencent.com": ("vcuda",),
        "nvidia.com": ("gpumem", "gpucore"),
        "aliyun.com": ("gpumem", "gpucount"),
        "fracgpu.io": ("",),
    }
)


# The longest resource name Kubernetes allows (a 253-character prefix, '/', 63 characters);
# longer keys are compared and quoted only this far.
_SHOWN_KEY_CHARS: Final = 317


@dataclass(frozen=True)
class ResourceNames:
    """The resource names each dialect uses; a cluster may rename them."""

    vcuda_core: str = names.RESOURCE_VCUDA_CORE
    vcuda_memory: str = names.RESOURCE_VCUDA_MEMORY
    vcuda_core_limit: str = names.RESOURCE_VCUDA_CORE_LIMIT
    hami_gpu: str = names.RESOURCE_HAMI_GPU
    hami_gpumem: str = names.RESOURCE_HAMI_GPUMEM
    hami_gpumem_percentage: str = names.RESOURCE_HAMI_GPUMEM_PERCENTAGE
    hami_gpucores: str = names.RESOURCE_HAMI_GPUCORES
    gpushare_mem: str = names.RESOURCE_GPUSHARE_MEM
    gpushare_count: str = names.RESOURCE_GPUSHARE_COUNT
    # Not a GPU request by itself: a HAMi container's priority, read beside its GPUs.
    hami_priority: str = names.RESOURCE_HAMI_PRIORITY

    # Computed once per instance (admission asks on every container); not dataclass fields, so
    # equality and hashing are unchanged.
    @cached_property
    def _by_dialect(self) -> Mapping[Dialect, tuple[str, ...]]:
        return MappingProxyType(
            {
                Dialect.TKESTACK: (self.vcuda_core, self.vcuda_memory, self.vcuda_core_limit),
                Dialect.HAMI: (
                    self.hami_gpu,
                    self.hami_gpumem,
                    self.hami_gpumem_percentage,
                    self.hami_gpucores,
                ),
                Dialect.GPUSHARE: (self.gpushare_mem, self.gpushare_count),
            }
        )

    @cached_property
    def _dialects_of(self) -> Mapping[str, frozenset[Dialect]]:
        found: dict[str, set[Dialect]] = {}
        for dialect, keys in self._by_dialect.items():
            for key in keys:
                found.setdefault(key, set()).add(dialect)
        return MappingProxyType({key: frozenset(d) for key, d in found.items()})

    @cached_property
    def _all(self) -> frozenset[str]:
        return frozenset(n for group in self._by_dialect.values() for n in group)

    @cached_property
    def _everything(self) -> frozenset[str]:
        return self._all | {self.hami_priority}

    def by_dialect(self) -> Mapping[Dialect, tuple[str, ...]]:
        return self._by_dialect

    def dialects_of(self, key: str) -> frozenset[Dialect]:
        """The dialects that use resource ``key`` (one, unless names were configured twice)."""
        return self._dialects_of.get(key, frozenset())

    def all(self) -> frozenset[str]:
        """The names that ask for GPUs."""
        return self._all

    def near_miss(self, key: str) -> str | None:
        """The configured name ``key`` was probably meant to be, when ``key`` is not one but
        looks like a GPU resource of some dialect (``GPU_LOOKALIKES``): a misspelling, or a
        dialect's stock name in a cluster that renamed it. Such a pod would otherwise be
        admitted as asking for no GPU and never scheduled. None for every other key."""
        if "/" not in key or key in self._everything:
            return None
        domain, _, rest = key.partition("/")
        prefixes = GPU_LOOKALIKES.get(domain.lower())
        if prefixes is None:
            return None
        bare = rest.lower().replace("-", "").replace("_", "").replace(".", "")
        if not bare.startswith(prefixes):
            return None
        # The key is the tenant's: compare (quadratic in length) only a bounded prefix.
        close = difflib.get_close_matches(
            key[:_SHOWN_KEY_CHARS], sorted(self._everything), n=1, cutoff=0.0
        )
        return close[0] if close else min(self._everything)

    def everything(self) -> frozenset[str]:
        """Every configured name: the GPU ones and the priority; fracgpu rewrites them all."""
        return self._everything

    def shared(self) -> Mapping[str, tuple[str, ...]]:
        """Each name configured for more than one resource, with those resources' fields in
        declaration order (``{"nvidia.com/gpu": ("vcuda_core", "hami_gpu")}``); empty when
        every name differs, as they must (a request could not be told apart otherwise)."""
        fields_of: dict[str, list[str]] = {}
        for field_ in fields(self):
            fields_of.setdefault(getattr(self, field_.name), []).append(field_.name)
        return MappingProxyType(
            {name: tuple(found) for name, found in fields_of.items() if len(found) > 1}
        )


@dataclass(frozen=True, slots=True)
class Range:
    """The whole numbers one GPU resource takes, and the message that states them."""

    low: int
    high: int
    allowed: str  # "use ...": every refusal of the resource says this


def _core_limit_rule(low: int) -> str:
    return (
        f"use a whole number {low}-{names.CORES_PER_GPU}: at least the guaranteed share, at "
        "most one GPU"
    )


@dataclass(frozen=True)
class DialectConfig:
    """Defaults for what a dialect leaves out; configuration, never literals in code."""

    names: ResourceNames = field(default_factory=ResourceNames)
    default_memory: MemoryRequest = WHOLE_CARD
    # 0 = best effort: no compute reserved or limited (HAMi's default for omitted gpucores).
    default_cores: int = 0
    default_gpu_count: int = 1
    gpushare_memory_unit_mib: int = 1024

    def __post_init__(self) -> None:
        if not 0 <= self.default_cores <= names.CORES_PER_GPU:
            raise ValueError(f"default_cores={self.default_cores}: use 0-100")
        if not 1 <= self.default_gpu_count <= MAX_GPUS_PER_CONTAINER:
            raise ValueError(f"default_gpu_count={self.default_gpu_count}: use 1-64")
        if self.gpushare_memory_unit_mib not in (1, 1024):
            raise ValueError("gpushare_memory_unit_mib: use 1024 (GiB) or 1 (MiB)")

    @cached_property
    def ranges(self) -> Mapping[str, Range]:
        """Each GPU resource's range, by name: one statement of it, given both to a value that
        is no whole number and to one out of range."""
        rn, cores, gpus = self.names, names.CORES_PER_GPU, MAX_GPUS_PER_CONTAINER
        unit = "GiB" if self.gpushare_memory_unit_mib == 1024 else "MiB"
        most = MAX_MEMORY_MIB // self.gpushare_memory_unit_mib
        whole = "use a whole number"
        return MappingProxyType(
            {
                rn.vcuda_core: Range(
                    1,
                    cores * gpus,
                    f"{whole} 1-{cores - 1} for a share of one GPU, or a multiple of {cores} "
                    f"up to {cores * gpus} for whole GPUs",
                ),
                rn.vcuda_memory: Range(
                    1,
                    _MAX_BLOCKS,
                    f"{whole} 1-{_MAX_BLOCKS}: blocks of {names.MEMORY_BLOCK_MIB} MiB",
                ),
                rn.vcuda_core_limit: Range(1, cores, _core_limit_rule(1)),
                rn.hami_gpu: Range(0, gpus, f"{whole} 0-{gpus}: GPUs (0 asks for none)"),
                rn.hami_gpumem: Range(
                    1, MAX_MEMORY_MIB, f"{whole} 1-{MAX_MEMORY_MIB}: MiB per GPU"
                ),
                rn.hami_gpumem_percentage: Range(
                    1, 100, f"{whole} 1-100: percent of each GPU's memory"
                ),
                rn.hami_gpucores: Range(
                    0, cores, f"{whole} 0-{cores}: percent of each GPU's compute"
                ),
                rn.gpushare_mem: Range(1, most, f"{whole} 1-{most}: {unit} per GPU"),
                rn.gpushare_count: Range(1, gpus, f"{whole} 1-{gpus}: GPUs"),
                rn.hami_priority: Range(0, 1, "use 0 (high priority) or 1 (low priority)"),
            }
        )


def gpu_resource_values(
    container: Mapping[str, object], config: DialectConfig
) -> dict[str, object]:
    """The container's GPU resources (limits), after checking requests equal limits."""
    name = _container_name(container)
    limits, requests = _resource_maps(name, container)
    keys = config.names.all()
    counts = _checked_counts(name, limits, requests, keys, config.ranges)
    return {key: limits[key] for key in counts}


def _resource_maps(
    name: str, container: Mapping[str, object]
) -> tuple[Mapping[str, object], Mapping[str, object]]:
    """The container's resource limits and requests (each ``{}`` when absent)."""
    resources = container.get("resources") or {}
    if type(resources) is not dict and not isinstance(resources, Mapping):  # exact type: fast
        raise RequestError(name, "resources", type(resources).__name__, "use a mapping")
    return _resource_map(name, resources, "limits"), _resource_map(name, resources, "requests")


def _checked_counts(
    name: str,
    limits: Mapping[str, object],
    requests: Mapping[str, object],
    keys: frozenset[str],
    ranges: Mapping[str, Range],
) -> dict[str, int]:
    """The limits of ``keys`` as counts, in name order, after checking each request equals
    its limit (a request without a limit is refused). ``ranges`` only words the refusal of a
    value that is no count: the dialects check ranges, as a pod fracgpu rewrote holds totals
    past them (2 x 70 cores = 140)."""
    counts: dict[str, int] = {}
    present = [k for k in limits if k in keys]
    if requests:
        present.extend(k for k in requests if k in keys and k not in limits)
    for key in sorted(present):
        if key not in limits:
            raise RequestError(
                name,
                f"requests[{key}]",
                shown(requests[key]),
                "set it under limits: GPU resources are extended resources, and Kubernetes "
                "requires their requests to equal their limits",
            )
        counts[key] = limit = _count(name, key, limits[key], ranges)
        if key in requests and _count(name, key, requests[key], ranges, "requests") != limit:
            raise RequestError(
                name,
                f"requests[{key}]",
                shown(requests[key]),
                f"make the request equal the limit {shown(limits[key])} "
                "(extended resources cannot be overcommitted)",
            )
    return counts


def parse_container(
    container: Mapping[str, object], config: DialectConfig
) -> ContainerRequest | None:
    """The canonical request of one container, or None when it asks for no GPU."""
    name = _container_name(container)
    limits, requests = _resource_maps(name, container)
    rn = config.names
    _refuse_near_misses(name, limits, requests, rn)
    counts = _checked_counts(name, limits, requests, rn.all(), config.ranges)
    if not counts:
        return None
    used: set[Dialect] = set()
    for key in counts:
        used |= rn.dialects_of(key)
    if len(used) > 1:
        raise RequestError(
            name,
            "resources",
            ",".join(counts),
            "use one dialect per container: TKEStack (vcuda-core/vcuda-memory), HAMi "
            "(nvidia.com/gpu with gpumem/gpucores) or gpushare (aliyun.com/gpu-mem)",
        )
    (dialect,) = used
    request: ContainerRequest | None
    if dialect is Dialect.TKESTACK:
        request = _parse_tkestack(name, counts, limits, config)
    elif dialect is Dialect.HAMI:
        request = _parse_hami(name, counts, limits, config)  # None: nvidia.com/gpu 0 asks none
    else:
        request = _parse_gpushare(name, counts, limits, config)
    priority = _container_priority(name, limits, requests, config)
    if request is None or priority is None:
        return request
    return replace(request, priority=priority)


def _refuse_near_misses(
    name: str, limits: Mapping[str, object], requests: Mapping[str, object], rn: ResourceNames
) -> None:
    for where, resources in (("limits", limits), ("requests", requests)):
        for key in resources:
            meant = rn.near_miss(key)
            if meant is not None:
                as_named = _shown_key(key)
                raise RequestError(
                    name,
                    f"{where}[{as_named}]",
                    shown(resources[key]),
                    f"{as_named} is not a GPU resource of this cluster (did you mean {meant}?); "
                    f"its GPU resources are {', '.join(sorted(rn.everything()))}",
                )


def _shown_key(key: str) -> str:
    """A tenant's resource name as a message quotes it: at most ``_SHOWN_KEY_CHARS``, the
    longest name Kubernetes allows (values are cut shorter, by ``quantity.shown``)."""
    return key if len(key) <= _SHOWN_KEY_CHARS else key[:_SHOWN_KEY_CHARS] + "..."


# HAMi's priority limit: 0 = high, 1 = low.
_HAMI_PRIORITIES: Final = {0: Priority.HIGH, 1: Priority.LOW}


def _container_priority(
    name: str, limits: Mapping[str, object], requests: Mapping[str, object], config: DialectConfig
) -> Priority | None:
    key = config.names.hami_priority
    if key not in limits and key not in requests:
        return None  # the usual case
    value = _checked_counts(name, limits, requests, frozenset({key}), config.ranges)[key]
    _check_range(name, key, value, limits, config)
    return _HAMI_PRIORITIES[value]


def with_pod_core_limit(
    requests: tuple[ContainerRequest, ...], annotations: Mapping[str, str], config: DialectConfig
) -> tuple[ContainerRequest, ...]:
    """Apply TKEStack's pod annotation ``vcuda-core-limit`` to the pod's shared TKEStack
    containers (a container's own ``vcuda-core-limit`` resource wins; whole GPUs have none)."""
    key = config.names.vcuda_core_limit
    raw = annotations.get(key)
    if raw is None:
        return requests
    if not raw.isdigit() or not 1 <= int(raw) <= names.CORES_PER_GPU:
        raise FracgpuError(
            f"annotation {key}={shown(raw)!r} is not allowed: use a whole number 1-100, the "
            "compute share each shared GPU container may use while its GPU is otherwise idle"
        )
    bound = int(raw)
    return tuple(
        _with_core_limit(r.container, f"annotation {key}", bound, raw, r)
        if r.dialect is Dialect.TKESTACK and r.core_limit is None and not r.exclusive
        else r
        for r in requests
    )


def _parse_tkestack(
    name: str, counts: dict[str, int], limits: Mapping[str, object], config: DialectConfig
) -> ContainerRequest:
    rn = config.names
    core = counts.get(rn.vcuda_core)
    blocks = counts.get(rn.vcuda_memory)
    core_limit = counts.get(rn.vcuda_core_limit)
    if core is None and blocks is None:
        raise RequestError(
            name,
            rn.vcuda_core_limit,
            shown(limits[rn.vcuda_core_limit]),
            f"set {rn.vcuda_core} as well",
        )
    if blocks is not None:
        _check_range(name, rn.vcuda_memory, blocks, limits, config)
    memory = MemoryRequest(mib=blocks * names.MEMORY_BLOCK_MIB) if blocks else config.default_memory
    limit_shown = None if core_limit is None else shown(limits[rn.vcuda_core_limit])
    if core is None:
        return _with_core_limit(
            name,
            rn.vcuda_core_limit,
            core_limit,
            limit_shown,
            ContainerRequest(name, config.default_gpu_count, config.default_cores, memory),
        )
    _check_range(name, rn.vcuda_core, core, limits, config)
    if core > names.CORES_PER_GPU and core % names.CORES_PER_GPU:
        _refuse(name, rn.vcuda_core, limits, config)
    if core >= names.CORES_PER_GPU:
        if core_limit is not None:
            raise RequestError(
                name, rn.vcuda_core_limit, limit_shown, "remove it: whole GPUs have no upper bound"
            )
        return ContainerRequest(name, core // names.CORES_PER_GPU, names.CORES_PER_GPU, WHOLE_CARD)
    return _with_core_limit(
        name, rn.vcuda_core_limit, core_limit, limit_shown, ContainerRequest(name, 1, core, memory)
    )


def _with_core_limit(
    name: str,
    field_name: str,
    core_limit: int | None,
    written: str | None,
    request: ContainerRequest,
) -> ContainerRequest:
    """``request`` with an upper compute bound of ``core_limit`` (``written`` by the pod so)."""
    if core_limit is None:
        return request
    low = max(request.cores, 1)
    if not low <= core_limit <= names.CORES_PER_GPU:
        raise RequestError(name, field_name, written, _core_limit_rule(low))
    return ContainerRequest(
        request.container, request.gpus, request.cores, request.memory, request.dialect, core_limit
    )


def _parse_hami(
    name: str, counts: dict[str, int], limits: Mapping[str, object], config: DialectConfig
) -> ContainerRequest | None:
    rn = config.names
    gpus = counts.get(rn.hami_gpu)
    mem = counts.get(rn.hami_gpumem)
    percent = counts.get(rn.hami_gpumem_percentage)
    cores = counts.get(rn.hami_gpucores)
    if gpus is None:
        gpus = config.default_gpu_count
    elif gpus == 0:
        extras = [
            k for k in (rn.hami_gpumem, rn.hami_gpumem_percentage, rn.hami_gpucores) if k in counts
        ]
        if not extras:
            return None  # HAMi's way of saying "no GPU"
        raise RequestError(
            name,
            rn.hami_gpu,
            shown(limits[rn.hami_gpu]),
            f"use a whole number 1-{MAX_GPUS_PER_CONTAINER} when {extras[0]} is set",
        )
    else:
        _check_range(name, rn.hami_gpu, gpus, limits, config)
    if mem is not None and percent is not None:
        raise RequestError(
            name,
            rn.hami_gpumem_percentage,
            shown(limits[rn.hami_gpumem_percentage]),
            f"set either {rn.hami_gpumem} (MiB) or {rn.hami_gpumem_percentage}, not both",
        )
    memory = config.default_memory
    if mem is not None:
        _check_range(name, rn.hami_gpumem, mem, limits, config)
        memory = MemoryRequest(mib=_round_up_to_blocks(mem))
    if percent is not None:
        _check_range(name, rn.hami_gpumem_percentage, percent, limits, config)
        memory = MemoryRequest(percent=percent)
    if cores is None:
        cores = config.default_cores
    else:
        _check_range(name, rn.hami_gpucores, cores, limits, config)
    if cores >= names.CORES_PER_GPU:
        memory = WHOLE_CARD
    return ContainerRequest(name, gpus, cores, memory, Dialect.HAMI)


def _parse_gpushare(
    name: str, counts: dict[str, int], limits: Mapping[str, object], config: DialectConfig
) -> ContainerRequest:
    rn = config.names
    amount = counts.get(rn.gpushare_mem)
    gpus = counts.get(rn.gpushare_count)
    if gpus is None:
        gpus = config.default_gpu_count
    else:
        _check_range(name, rn.gpushare_count, gpus, limits, config)
    memory = config.default_memory
    if amount is not None:
        _check_range(name, rn.gpushare_mem, amount, limits, config)
        memory = MemoryRequest(mib=_round_up_to_blocks(amount * config.gpushare_memory_unit_mib))
    return ContainerRequest(name, gpus, config.default_cores, memory, Dialect.GPUSHARE)


def _check_range(
    name: str, key: str, value: int, limits: Mapping[str, object], config: DialectConfig
) -> None:
    bounds = config.ranges[key]
    if not bounds.low <= value <= bounds.high:
        _refuse(name, key, limits, config)


def _refuse(name: str, key: str, limits: Mapping[str, object], config: DialectConfig) -> NoReturn:
    """Refuse the limit of ``key``, echoed as the pod wrote it, with the resource's range."""
    raise RequestError(name, key, shown(limits[key]), config.ranges[key].allowed)


def canonical_counts(assigned: ContainerAssignment) -> tuple[int, int]:
    """(cores, 256 MiB blocks): what kubelet counts of the canonical resources."""
    cores = blocks = 0
    for dev in assigned.devices:  # one loop: most containers hold one GPU
        cores += dev.cores
        blocks += dev.memory_mib // names.MEMORY_BLOCK_MIB
    return cores, blocks


def canonical_quantities(assigned: ContainerAssignment) -> dict[str, str]:
    """Canonical resource values (cores, 256 MiB blocks) that kubelet and ResourceQuota count."""
    cores, blocks = canonical_counts(assigned)
    return {
        names.RESOURCE_VCUDA_CORE: format_count(cores),
        names.RESOURCE_VCUDA_MEMORY: format_count(blocks),
    }


def _round_up_to_blocks(mib: int) -> int:
    block = names.MEMORY_BLOCK_MIB
    return -(-mib // block) * block


def _count(
    container: str, key: str, raw: object, ranges: Mapping[str, Range], where: str = ""
) -> int:
    try:
        return parse_count(raw)
    except QuantityError as error:
        # Negative, fractional or no quantity at all: one message with the resource's range.
        bounds = ranges.get(key)
        allowed = str(error) if bounds is None else bounds.allowed
        field = f"{where}[{key}]" if where else key
        raise RequestError(container, field, shown(raw), allowed) from None


def _container_name(container: Mapping[str, object]) -> str:
    name = container.get("name")
    return name if isinstance(name, str) and name else "<unnamed>"


def _resource_map(name: str, resources: Mapping[str, object], key: str) -> Mapping[str, object]:
    value = resources.get(key) or {}
    if type(value) is not dict and not isinstance(value, Mapping):
        raise RequestError(name, f"resources.{key}", type(value).__name__, "use a mapping")
    return value
