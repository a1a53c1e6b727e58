"""The agent's only contact with the shim file ABI (limits file, accounting region).

PROVISIONAL: until ``fracgpu/shim_abi.py`` (owned by the shim) lands, this follows the
layout of shim/include/fracgpu_abi.h directly; then it becomes thin calls into
fracgpu.shim_abi. Nothing else in the agent knows the byte layout or the key names.
"""

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.limits import ContainerLimits

# fracgpu_abi.h: region header and per-device records.
REGION_MAGIC = 0x3155504743415246
REGION_VERSION = 1
REGION_SIZE = 65536
_HDR_MAGIC = 0
_HDR_VERSION = 8
_HDR_DEVICE_COUNT = 24
_DEVICES_OFF = 256
_DEV_SIZE = 128
_DEV_UUID_SIZE = 48
_MAX_DEVICES = 16


class ShimAbiError(ValueError):
    """A limits file or region that does not follow the shim ABI; says what is wrong."""


def encode_limits(limits: "ContainerLimits") -> str:
    lines = [
        "version=1",
        f"mode={'whole' if limits.whole else 'sliced'}",
        f"namespace={limits.namespace}",
        f"pod={limits.pod}",
        f"container={limits.container}",
    ]
    if limits.pod_uid:
        lines.append(f"pod_uid={limits.pod_uid}")
    lines.append(f"compute_limit_enabled={int(limits.compute_limit_enabled)}")
    lines.append(f"device_count={len(limits.devices)}")
    for i, device in enumerate(limits.devices):
        lines.append(f"device.{i}.uuid={device.uuid}")
        lines.append(f"device.{i}.memory_limit_bytes={device.memory_limit_bytes}")
        if device.core_limit is not None:
            lines.append(f"device.{i}.core_limit={device.core_limit}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class LimitsSummary:
    """What the metrics need from a limits file: who, and per GPU memory and compute."""

    namespace: str
    pod: str
    container: str
    # (uuid, memory limit bytes, core limit percent or None)
    devices: tuple[tuple[str, int, int | None], ...]


def decode_limits(text: str) -> LimitsSummary:
    fields: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ShimAbiError(f"limits line {raw!r} is not key=value")
        fields[key.strip()] = value.strip()
    if fields.get("version") != "1":
        raise ShimAbiError(f"limits version {fields.get('version')!r} is not supported: use 1")
    try:
        count = int(fields.get("device_count", "0"))
        devices = tuple(
            (
                fields[f"device.{i}.uuid"],
                int(fields[f"device.{i}.memory_limit_bytes"]),
                int(fields[f"device.{i}.core_limit"])
                if f"device.{i}.core_limit" in fields
                else None,
            )
            for i in range(count)
        )
    except (KeyError, ValueError) as error:
        raise ShimAbiError(f"limits file has a bad or missing device field: {error}") from None
    return LimitsSummary(
        fields.get("namespace", ""), fields.get("pod", ""), fields.get("container", ""), devices
    )


@dataclass(frozen=True)
class RegionDevice:
    uuid: str
    memory_limit_bytes: int
    memory_used_bytes: int
    memory_peak_bytes: int
    oom_rejections: int
    kernel_launches: int
    kernel_time_ns: int
    throttle_ns: int
    core_limit: int


def decode_region(data: bytes) -> tuple[RegionDevice, ...]:
    """The per-GPU counters of one container's accounting region."""
    if len(data) < _DEVICES_OFF + _DEV_SIZE:
        raise ShimAbiError(f"region is {len(data)} bytes, smaller than the header")
    (magic,) = struct.unpack_from("<Q", data, _HDR_MAGIC)
    if magic != REGION_MAGIC:
        raise ShimAbiError(f"region magic {magic:#x} is not fracgpu's {REGION_MAGIC:#x}")
    (version,) = struct.unpack_from("<I", data, _HDR_VERSION)
    if version != REGION_VERSION:
        raise ShimAbiError(f"region version {version} is not supported: use {REGION_VERSION}")
    (count,) = struct.unpack_from("<I", data, _HDR_DEVICE_COUNT)
    if count > _MAX_DEVICES or len(data) < _DEVICES_OFF + count * _DEV_SIZE:
        raise ShimAbiError(f"region device_count {count} is out of range: use 0-{_MAX_DEVICES}")
    devices = []
    for i in range(count):
        off = _DEVICES_OFF + i * _DEV_SIZE
        uuid = data[off : off + _DEV_UUID_SIZE].split(b"\0", 1)[0].decode("ascii", "replace")
        limit, used, peak, ooms, launches, ktime, throttle, _tat = struct.unpack_from(
            "<8Q", data, off + _DEV_UUID_SIZE
        )
        (core,) = struct.unpack_from("<I", data, off + 112)
        devices.append(RegionDevice(uuid, limit, used, peak, ooms, launches, ktime, throttle, core))
    return tuple(devices)
