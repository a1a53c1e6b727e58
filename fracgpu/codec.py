"""The only place that turns the model into JSON (annotations, custom resources) and back.

Annotation payloads carry an explicit ``version``; custom resources are versioned by their
apiVersion. Decoding is strict: unknown versions, unknown keys, wrong types and out-of-range
values are rejected with a ``CodecError`` that says which field and what is allowed.
"""

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import orjson

from fracgpu.errors import CodecError
from fracgpu.model import (
    Assignment,
    ContainerAssignment,
    GPUAllocation,
    GPUDevice,
    Grants,
    Priority,
    Quota,
    Reservation,
    ResourceAmounts,
    ResourceLimits,
)
from fracgpu.names import CORES_PER_GPU, MAX_MEMORY_SCALING

ASSIGNMENT_VERSION: Final = 1
MAX_ANNOTATION_BYTES: Final = 64 * 1024
# Compact and sorted, so an assignment always encodes to the same text (validation compares
# it with what is written). Earlier versions wrote it with this encoder, and pods they
# admitted must still compare equal; orjson writes the same text several times faster,
# except that it leaves non-ASCII characters unescaped (names in Kubernetes are ASCII).
_ANNOTATION_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), sort_keys=True)
_T = TypeVar("_T")


# -- assignment annotation -------------------------------------------------------------------
def encode_assignment(assignment: Assignment) -> str:
    payload: dict[str, Any] = {
        "version": ASSIGNMENT_VERSION,
        "node": assignment.node,
        "reservationId": assignment.reservation_id,
        "containers": [_encode_container(c) for c in assignment.containers],
    }
    # Settings at their defaults are left out, so most annotations stay as short as before.
    if assignment.memory_scaling != 1.0:
        payload["memoryScaling"] = assignment.memory_scaling
    if not assignment.compute_limit:
        payload["computeLimit"] = False
    text = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode()
    # isprintable: json escapes DEL (\x7f) too, which orjson writes as is.
    return text if text.isascii() and text.isprintable() else _ANNOTATION_ENCODER.encode(payload)


def _encode_container(container: ContainerAssignment) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": container.container,
        "devices": [_encode_allocation(d) for d in container.devices],
    }
    if container.core_limit is not None:
        entry["coreLimit"] = container.core_limit
    if container.priority is not None:
        entry["priority"] = container.priority.value
    return entry


def decode_assignment(text: str, what: str = "assignment annotation") -> Assignment:
    """The assignment in ``text``; its errors start with ``what`` (where the text was)."""
    if len(text.encode()) > MAX_ANNOTATION_BYTES:
        raise CodecError(what, f"is larger than {MAX_ANNOTATION_BYTES} bytes")
    try:
        # orjson: validation reads this annotation on every pod; it also refuses what JSON
        # does not allow (NaN, integers past 64 bits) and nests no deeper than 1,024 levels.
        payload = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise CodecError(what, f"is not JSON ({error})") from None
    obj = _object(
        what,
        payload,
        required={"version", "node", "reservationId", "containers"},
        optional={"memoryScaling", "computeLimit"},
    )
    version = _field(what, obj, "version", int)
    if version != ASSIGNMENT_VERSION:
        raise CodecError(what, f"version {version} is not supported: use {ASSIGNMENT_VERSION}")
    containers = []
    for i, raw in enumerate(_field(what, obj, "containers", list)):
        where = f"{what} containers[{i}]"
        entry = _object(
            where, raw, required={"name", "devices"}, optional={"coreLimit", "priority"}
        )
        devices = tuple(
            _decode_allocation(f"{where} devices[{j}]", dev)
            for j, dev in enumerate(_field(where, entry, "devices", list))
        )
        if not devices:
            raise CodecError(where, "has no devices: every assigned container holds a GPU")
        core_limit = (
            _bounded(where, entry, "coreLimit", 1, CORES_PER_GPU) if "coreLimit" in entry else None
        )
        if core_limit is not None and any(d.cores > core_limit for d in devices):
            raise CodecError(where, f"coreLimit={core_limit} is below the cores it holds")
        containers.append(
            ContainerAssignment(
                _name(where, entry, "name"), devices, core_limit, _priority(where, entry)
            )
        )
    names = [c.container for c in containers]
    if len(set(names)) != len(names):
        raise CodecError(what, "names a container twice")
    return Assignment(
        _name(what, obj, "node"),
        _name(what, obj, "reservationId"),
        tuple(containers),
        memory_scaling=decode_memory_scaling(what, obj.get("memoryScaling", 1.0)),
        compute_limit=_field(what, obj, "computeLimit", bool, True),
    )


def _priority(what: str, entry: Mapping[str, Any]) -> Priority | None:
    if "priority" not in entry:
        return None
    raw = _field(what, entry, "priority", str)
    try:
        return Priority(raw)
    except ValueError:
        allowed = " or ".join(p.value for p in Priority)
        raise CodecError(what, f"priority={raw!r} is not allowed: use {allowed}") from None


def decode_memory_scaling(what: str, raw: object) -> float:
    """A memory scaling factor: a number from 1 to MAX_MEMORY_SCALING."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise CodecError(what, f"memoryScaling must be a number, not {type(raw).__name__}")
    if not 1.0 <= raw <= MAX_MEMORY_SCALING:
        raise CodecError(
            what, f"memoryScaling={raw} is out of range: use 1 to {MAX_MEMORY_SCALING:g}"
        )
    return float(raw)


def _encode_allocation(alloc: GPUAllocation) -> dict[str, Any]:
    return {"uuid": alloc.uuid, "cores": alloc.cores, "memoryMiB": alloc.memory_mib}


def _decode_allocation(what: str, raw: object) -> GPUAllocation:
    obj = _object(what, raw, required={"uuid", "cores", "memoryMiB"})
    cores = _bounded(what, obj, "cores", 0, CORES_PER_GPU)
    memory = _bounded(what, obj, "memoryMiB", 0, 2**40)
    return GPUAllocation(_name(what, obj, "uuid"), cores, memory)


# -- GPUNode status: devices and reservations ---------------------------------------------------
def encode_device(device: GPUDevice) -> dict[str, Any]:
    return {
        "uuid": device.uuid,
        "index": device.index,
        "model": device.model,
        "memoryMiB": device.memory_mib,
        "healthy": device.healthy,
        "migEnabled": device.mig_enabled,
        "pciBusId": device.pci_bus_id,
    }


def decode_device(what: str, raw: object) -> GPUDevice:
    obj = _object(
        what,
        raw,
        required={"uuid", "index", "model", "memoryMiB", "healthy"},
        optional={"migEnabled", "pciBusId"},
    )
    return GPUDevice(
        uuid=_name(what, obj, "uuid"),
        index=_bounded(what, obj, "index", 0, 1023),
        model=_name(what, obj, "model"),
        memory_mib=_bounded(what, obj, "memoryMiB", 1, 2**40),
        healthy=_field(what, obj, "healthy", bool),
        mig_enabled=_field(what, obj, "migEnabled", bool, default=False),
        pci_bus_id=_field(what, obj, "pciBusId", str, default=""),
    )


def decode_devices(what: str, raw: object) -> tuple[GPUDevice, ...]:
    if not isinstance(raw, list):
        raise CodecError(what, f"must be a list, not {type(raw).__name__}")
    devices = tuple(decode_device(f"{what}[{i}]", d) for i, d in enumerate(raw))
    uuids = [d.uuid for d in devices]
    if len(set(uuids)) != len(uuids):
        raise CodecError(what, "lists a GPU UUID twice")
    return devices


def encode_reservation(reservation: Reservation) -> dict[str, Any]:
    """A GPUNode status.reservations entry (the node is the GPUNode itself)."""
    encoded: dict[str, Any] = {
        "id": reservation.id,
        "namespace": reservation.namespace,
        "allocations": [_encode_allocation(a) for a in reservation.allocations],
        "expiresAt": format_timestamp(reservation.expires_at),
    }
    if reservation.pod:  # generateName pods have no name yet; the field is optional
        encoded["pod"] = reservation.pod
    return encoded


def decode_reservation(what: str, raw: object, node: str) -> Reservation:
    obj = _object(
        what, raw, required={"id", "namespace", "expiresAt", "allocations"}, optional={"pod"}
    )
    allocations = tuple(
        _decode_allocation(f"{what} allocations[{i}]", a)
        for i, a in enumerate(_field(what, obj, "allocations", list))
    )
    return Reservation(
        id=_name(what, obj, "id"),
        node=node,
        namespace=_name(what, obj, "namespace"),
        pod=_field(what, obj, "pod", str, default=""),
        allocations=allocations,
        expires_at=parse_timestamp(what, _field(what, obj, "expiresAt", str)),
    )


def format_timestamp(unix_seconds: int) -> str:
    """RFC 3339 in UTC, as Kubernetes writes date-time fields."""
    return datetime.fromtimestamp(unix_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(what: str, text: str) -> int:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CodecError(
            what, f"{text!r} is not an RFC 3339 time such as 2026-01-02T03:04:05Z"
        ) from None
    if moment.tzinfo is None:
        raise CodecError(what, f"{text!r} has no time zone: use a trailing Z for UTC")
    return int(moment.timestamp())


# -- GPUQuota ---------------------------------------------------------------------------------
_LIMIT_KEYS: Final = {"cores", "memoryMiB", "gpus"}


def encode_limits(limits: ResourceLimits) -> dict[str, int]:
    raw = {"cores": limits.cores, "memoryMiB": limits.memory_mib, "gpus": limits.gpus}
    return {k: v for k, v in raw.items() if v is not None}


def encode_amounts(amounts: ResourceAmounts) -> dict[str, int]:
    return {"cores": amounts.cores, "memoryMiB": amounts.memory_mib, "gpus": amounts.gpus}


def decode_limits(what: str, raw: object) -> ResourceLimits:
    obj = _object(what, raw, required=set(), optional=_LIMIT_KEYS)

    def limit(key: str) -> int | None:
        return _bounded(what, obj, key, 0, 2**50) if key in obj else None

    return ResourceLimits(limit("cores"), limit("memoryMiB"), limit("gpus"))


def decode_amounts(what: str, raw: object) -> ResourceAmounts:
    obj = _object(what, raw, required=set(), optional=_LIMIT_KEYS)

    def amount(key: str) -> int:
        return _bounded(what, obj, key, 0, 2**50) if key in obj else 0

    return ResourceAmounts(amount("cores"), amount("memoryMiB"), amount("gpus"))


def encode_quota_spec(quota: Quota) -> dict[str, Any]:
    spec: dict[str, Any] = {"hard": encode_limits(quota.hard)}
    if quota.hard_by_model:
        spec["models"] = {m: encode_limits(v) for m, v in sorted(quota.hard_by_model.items())}
    if quota.pools:
        spec["pools"] = list(quota.pools)
    if quota.grants != Grants():
        spec["grants"] = {
            "priority": quota.grants.priority.value,
            "privilegedContainers": quota.grants.privileged,
        }
    return spec


def encode_quota_status(quota: Quota) -> dict[str, Any]:
    return {
        "used": encode_amounts(quota.used),
        "usedByModel": {m: encode_amounts(v) for m, v in sorted(quota.used_by_model.items())},
    }


def decode_quota(raw: object) -> Quota:
    """Decode a whole GPUQuota object as the API returns it."""
    what = "GPUQuota"
    obj = _object(what, raw, required={"metadata", "spec"}, optional=None)
    meta = _object(
        f"{what} metadata", obj["metadata"], required={"name", "namespace"}, optional=None
    )
    where = f"GPUQuota {meta['namespace']}/{meta['name']}"
    spec = _object(
        f"{where} spec",
        obj["spec"],
        required=set(),
        optional={"hard", "models", "pools", "grants"},
    )
    status_raw = obj.get("status") or {}
    status = _object(
        f"{where} status", status_raw, required=set(), optional={"used", "usedByModel"}
    )
    pools = _field(where, spec, "pools", list, default=[])
    if not all(isinstance(p, str) and p for p in pools):
        raise CodecError(f"{where} spec.pools", "must be a list of non-empty pool names")
    return Quota(
        namespace=_name(where, meta, "namespace"),
        name=_name(where, meta, "name"),
        hard=decode_limits(f"{where} spec.hard", spec.get("hard") or {}),
        hard_by_model=_model_map(where, spec, "models", decode_limits),
        pools=tuple(pools),
        grants=decode_grants(f"{where} spec.grants", spec.get("grants") or {}),
        used=decode_amounts(f"{where} status.used", status.get("used") or {}),
        used_by_model=_model_map(where, status, "usedByModel", decode_amounts),
        resource_version=str(meta.get("resourceVersion", "")),
    )


def decode_grants(what: str, raw: object) -> Grants:
    obj = _object(what, raw, required=set(), optional={"priority", "privilegedContainers"})
    priority = _field(what, obj, "priority", str, default=Priority.LOW.value)
    if priority not in {p.value for p in Priority}:
        raise CodecError(f"{what}.priority", f"{priority!r} is not allowed: use high or low")
    privileged = _field(what, obj, "privilegedContainers", bool, default=False)
    return Grants(Priority(priority), privileged)


def _model_map(where: str, obj: Mapping[str, Any], key: str, decode: Any) -> dict[str, Any]:
    raw = _field(where, obj, key, dict, default={})
    result = {}
    for model, value in raw.items():
        if not isinstance(model, str) or not model:
            raise CodecError(f"{where} {key}", "keys must be GPU model names")
        result[model] = decode(f"{where} {key}[{model}]", value)
    return result


# -- strict field readers ---------------------------------------------------------------------
def _object(
    what: str,
    raw: object,
    *,
    required: set[str],
    optional: set[str] | frozenset[str] | None = frozenset(),
) -> dict[str, Any]:
    """A JSON object with the required keys; unknown keys rejected unless optional is None."""
    if not isinstance(raw, dict):
        raise CodecError(what, f"must be a JSON object, not {type(raw).__name__}")
    missing = required - raw.keys()
    if missing:
        raise CodecError(what, f"is missing {', '.join(sorted(missing))}")
    if optional is not None:
        unknown = raw.keys() - required - optional
        if unknown:
            raise CodecError(
                what,
                f"has unknown field(s) {', '.join(sorted(map(str, unknown)))}: "
                f"allowed are {', '.join(sorted(required | optional))}",
            )
    return raw


def _field(
    what: str, obj: Mapping[str, Any], key: str, kind: type[_T], default: _T | None = None
) -> _T:
    if key not in obj:
        if default is None:
            raise CodecError(what, f"is missing {key}")
        return default
    value = obj[key]
    # bool is an int in Python; JSON keeps them apart, so do we.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CodecError(what, f"{key} must be {kind.__name__}, not {type(value).__name__}")
    return value


def _bounded(what: str, obj: Mapping[str, Any], key: str, low: int, high: int) -> int:
    value = _field(what, obj, key, int)
    if not low <= value <= high:
        raise CodecError(what, f"{key}={value} is out of range: use {low}-{high}")
    return value


def _name(what: str, obj: Mapping[str, Any], key: str) -> str:
    value = _field(what, obj, key, str)
    if not value or len(value) > 253:
        raise CodecError(what, f"{key} must be 1-253 characters")
    return value
