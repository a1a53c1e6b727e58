"""What a queued pod asks, as admission wrote it into the ``fracgpu.io/queued`` annotation.

A queued pod's containers carry canonical resources (kubelet and ResourceQuota count them),
which cannot say everything the pod asked (2 GPUs x 70 cores is 140 vcuda-core, a share of a
card's memory is not a block count), so the ask itself travels in the annotation: the
containers' requests, the pod's CPU and memory, its GPU model/UUID constraints, policy,
queue rank (granted priority, pod priority, arrival) and the quota charge held while it
waits. Admission seals it with an HMAC (``seal``), so validation can tell fracgpu's entry
from one a tenant wrote; tenants cannot change it later (fracgpu's annotations are
reserved on update).
"""

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from fracgpu import names
from fracgpu.errors import CodecError
from fracgpu.model import (
    ContainerAssignment,
    ContainerRequest,
    Dialect,
    GPUAllocation,
    MemoryRequest,
    Priority,
    virtual_memory_mib,
)
from fracgpu.placement import ClusterView, Constraints, PodDemand, Policy

ENTRY_VERSION: Final = 1
MAX_ENTRY_BYTES: Final = 64 * 1024
WHAT: Final = f"annotation {names.ANNOTATION_QUEUED}"


@dataclass(frozen=True, slots=True)
class QueuedEntry:
    requests: tuple[ContainerRequest, ...]
    cpu_milli: int
    memory_mib: int
    constraints: Constraints
    policy: Policy
    # Queue rank: a granted high fracgpu priority first, then the pod's priority, then arrival.
    high_priority: bool
    pod_priority: int
    queued_at_ms: int
    # Memory per GPU charged to quota while waiting (a share of the largest eligible card).
    charged_mib: tuple[int, ...]
    seal: str = ""

    def demand(self) -> PodDemand:
        return PodDemand(self.requests, self.cpu_milli, self.memory_mib, self.constraints)

    def charge(self) -> tuple[GPUAllocation, ...]:
        """The quota charge while the pod waits: its GPUs, on no GPU in particular (no
        model: per-model limits are checked when it is placed)."""
        return tuple(
            GPUAllocation("", r.cores, mib)
            for r, mib in zip(self.requests, self.charged_mib, strict=True)
            for _ in range(r.gpus)
        )

    def charged_containers(self) -> tuple[ContainerAssignment, ...]:
        """The charge per container, for the canonical resources written on the pod."""
        return tuple(
            ContainerAssignment(
                r.container, (GPUAllocation("", r.cores, mib),) * r.gpus, r.core_limit, r.priority
            )
            for r, mib in zip(self.requests, self.charged_mib, strict=True)
        )

    def rank(self) -> tuple[int, int, int]:
        """Sort key: lower goes first."""
        return (0 if self.high_priority else 1, -self.pod_priority, self.queued_at_ms)

    def sealed(self, key: bytes, namespace: str, reservation_id: str) -> "QueuedEntry":
        return replace(self, seal=_mac(key, self, namespace, reservation_id))

    def seal_holds(self, key: bytes, namespace: str, reservation_id: str) -> bool:
        expected = _mac(key, self, namespace, reservation_id)
        return bool(self.seal) and hmac.compare_digest(self.seal, expected)


def charged_memory(view: ClusterView, demand: PodDemand) -> tuple[int, ...]:
    """Memory per GPU to charge for each container: MiB as asked, a share of the card as
    that share of the largest card the pod may use (an upper bound; placement charges the
    card it gets)."""
    largest = 0
    for node in view.nodes():
        if not demand.constraints.allows_pool(node.pool):
            continue
        scaling = view.memory_scaling(node.name)
        for device in node.devices:
            if device.healthy and demand.constraints.allows(device):
                largest = max(largest, virtual_memory_mib(device.memory_mib, scaling))
    return tuple(r.memory.resolve(largest) for r in demand.containers)


def encode(entry: QueuedEntry) -> str:
    return orjson.dumps(_payload(entry, with_seal=True), option=orjson.OPT_SORT_KEYS).decode()


def decode(text: str) -> QueuedEntry:
    if len(text.encode()) > MAX_ENTRY_BYTES:
        raise CodecError(WHAT, f"is larger than {MAX_ENTRY_BYTES} bytes")
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise CodecError(WHAT, f"is not JSON ({error})") from None
    obj = _object(raw, WHAT, _TOP_KEYS)
    if obj["version"] != ENTRY_VERSION:
        raise CodecError(WHAT, f"version {obj['version']!r} is not supported: use {ENTRY_VERSION}")
    requests, charged = [], []
    for i, item in enumerate(_list(obj, "containers", WHAT)):
        request, mib = _request(item, f"{WHAT} containers[{i}]")
        requests.append(request)
        charged.append(mib)
    if not requests:
        raise CodecError(WHAT, "names no container")
    try:
        policy = Policy(_str(obj, "policy", WHAT))
    except ValueError:
        raise CodecError(WHAT, f"policy {obj['policy']!r} is unknown") from None
    where = obj["constraints"]
    if not isinstance(where, dict) or set(where) - _CONSTRAINT_KEYS:
        raise CodecError(WHAT, f"constraints must be an object of {sorted(_CONSTRAINT_KEYS)}")
    lists = {key: tuple(_strings(where, key)) if key in where else () for key in _CONSTRAINT_KEYS}
    constraints = Constraints(
        include_models=lists["include_models"],
        exclude_models=lists["exclude_models"],
        include_uuids=lists["include_uuids"],
        exclude_uuids=lists["exclude_uuids"],
    )
    return QueuedEntry(
        requests=tuple(requests),
        cpu_milli=_int(obj, "cpuMilli", WHAT),
        memory_mib=_int(obj, "memoryMiB", WHAT),
        constraints=constraints,
        policy=policy,
        high_priority=_bool(obj, "highPriority", WHAT),
        pod_priority=_int(obj, "podPriority", WHAT, low=-(2**31)),
        queued_at_ms=_int(obj, "queuedAtMs", WHAT),
        charged_mib=tuple(charged),
        seal=_str(obj, "seal", WHAT),
    )


def new_entry(
    demand: PodDemand,
    policy: Policy,
    *,
    high_priority: bool,
    pod_priority: int,
    queued_at_ms: int,
    charged_mib: Sequence[int],
) -> QueuedEntry:
    constraints = Constraints(
        include_models=demand.constraints.include_models,
        exclude_models=demand.constraints.exclude_models,
        include_uuids=demand.constraints.include_uuids,
        exclude_uuids=demand.constraints.exclude_uuids,
    )  # node narrowing and pools are worked out again when the pod is placed
    return QueuedEntry(
        demand.containers,
        demand.cpu_milli,
        demand.memory_mib,
        constraints,
        policy,
        high_priority,
        pod_priority,
        queued_at_ms,
        tuple(charged_mib),
    )


# -- internals -----------------------------------------------------------------------------
_TOP_KEYS: Final = frozenset(
    {
        "version",
        "containers",
        "cpuMilli",
        "memoryMiB",
        "constraints",
        "policy",
        "highPriority",
        "podPriority",
        "queuedAtMs",
        "seal",
    }
)
_CONSTRAINT_KEYS: Final = frozenset(
    {"include_models", "exclude_models", "include_uuids", "exclude_uuids"}
)
_CONTAINER_KEYS: Final = frozenset(
    {"name", "gpus", "cores", "memoryMiB", "memoryPercent", "chargedMiB", "dialect"}
)
_CONTAINER_OPTIONAL: Final = frozenset({"coreLimit", "priority"})


def _payload(entry: QueuedEntry, *, with_seal: bool) -> dict[str, Any]:
    containers = []
    for request, mib in zip(entry.requests, entry.charged_mib, strict=True):
        item: dict[str, Any] = {
            "name": request.container,
            "gpus": request.gpus,
            "cores": request.cores,
            "memoryMiB": request.memory.mib or 0,
            "memoryPercent": request.memory.percent or 0,
            "chargedMiB": mib,
            "dialect": request.dialect.value,
        }
        if request.core_limit is not None:
            item["coreLimit"] = request.core_limit
        if request.priority is not None:
            item["priority"] = request.priority.value
        containers.append(item)
    c = entry.constraints
    constraints = {
        key: list(value)
        for key, value in (
            ("include_models", c.include_models),
            ("exclude_models", c.exclude_models),
            ("include_uuids", c.include_uuids),
            ("exclude_uuids", c.exclude_uuids),
        )
        if value
    }
    payload: dict[str, Any] = {
        "version": ENTRY_VERSION,
        "containers": containers,
        "cpuMilli": entry.cpu_milli,
        "memoryMiB": entry.memory_mib,
        "constraints": constraints,
        "policy": entry.policy.value,
        "highPriority": entry.high_priority,
        "podPriority": entry.pod_priority,
        "queuedAtMs": entry.queued_at_ms,
        "seal": entry.seal if with_seal else "",
    }
    return payload


def _mac(key: bytes, entry: QueuedEntry, namespace: str, reservation_id: str) -> str:
    body = orjson.dumps(_payload(entry, with_seal=False), option=orjson.OPT_SORT_KEYS)
    message = b"\0".join((namespace.encode(), reservation_id.encode(), body))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _request(raw: object, where: str) -> tuple[ContainerRequest, int]:
    obj = _object(raw, where, _CONTAINER_KEYS, _CONTAINER_OPTIONAL)
    mib, percent = _int(obj, "memoryMiB", where), _int(obj, "memoryPercent", where)
    if (mib == 0) == (percent == 0) or percent > 100:
        raise CodecError(where, "needs exactly one of memoryMiB or memoryPercent (1-100)")
    memory = MemoryRequest(mib=mib) if mib else MemoryRequest(percent=percent)
    try:
        dialect = Dialect(_str(obj, "dialect", where))
        priority = Priority(obj["priority"]) if "priority" in obj else None
    except ValueError:
        raise CodecError(where, "dialect or priority is unknown") from None
    gpus = _int(obj, "gpus", where, low=1)
    cores = _int(obj, "cores", where)
    if cores > names.CORES_PER_GPU:
        raise CodecError(where, f"cores must be 0-{names.CORES_PER_GPU}")
    request = ContainerRequest(
        _str(obj, "name", where),
        gpus,
        cores,
        memory,
        dialect,
        _int(obj, "coreLimit", where) if "coreLimit" in obj else None,
        priority,
    )
    return request, _int(obj, "chargedMiB", where, low=1)


def _object(
    raw: object, where: str, keys: frozenset[str], optional: frozenset[str] = frozenset()
) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise CodecError(where, "must be a JSON object")
    missing = keys - raw.keys()
    unknown = raw.keys() - keys - optional
    if missing or unknown:
        raise CodecError(
            where, f"needs exactly the fields {sorted(keys)} (and optionally {sorted(optional)})"
        )
    return raw


def _int(obj: Mapping[str, Any], key: str, where: str, low: int = 0) -> int:
    value = obj[key]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 2**53:
        raise CodecError(where, f"{key} must be a whole number of {low} or more")
    return value


def _bool(obj: Mapping[str, Any], key: str, where: str) -> bool:
    value = obj[key]
    if not isinstance(value, bool):
        raise CodecError(where, f"{key} must be true or false")
    return value


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj[key]
    if not isinstance(value, str) or len(value) > 253:
        raise CodecError(where, f"{key} must be a string of at most 253 characters")
    return value


def _list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = obj[key]
    if not isinstance(value, list):
        raise CodecError(where, f"{key} must be a list")
    return value


def _strings(obj: Mapping[str, Any], key: str) -> list[str]:
    value = obj[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CodecError(WHAT, f"constraints.{key} must be a list of strings")
    return value
