"""The file ABI shared with the C shim: the limits file and the accounting region.

``shim/include/fracgpu_abi.h`` is the C side; ``tests/core/test_shim_abi.py`` parses
that header and checks every name, version, offset and size below against it.

This module only turns values into bytes and bytes into values; reading and writing
the files is the agent's job. The limits file is line-based ``key=value`` UTF-8 text
whose first setting is ``version=1``; the shim refuses anything else (fail closed).
The region is a fixed-size little-endian binary file that every process of a
container maps; the agent reads it for metrics.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Final

from fracgpu import names
from fracgpu.errors import CodecError

LIMITS_PATH: Final = names.CONTAINER_LIMITS_PATH
REGION_PATH: Final = names.CONTAINER_REGION_PATH
LIBRARY_PATH: Final = names.CONTAINER_LIBRARY_PATH

# ---- limits file ----
LIMITS_VERSION: Final = 1
LIMITS_MAX_BYTES: Final = 65536
LIMITS_MAX_LINE: Final = 1024
KEY_VERSION: Final = "version"
KEY_MODE: Final = "mode"
KEY_NAMESPACE: Final = "namespace"
KEY_POD: Final = "pod"
KEY_CONTAINER: Final = "container"
KEY_POD_UID: Final = "pod_uid"
KEY_DEVICE_COUNT: Final = "device_count"
KEY_COMPUTE_LIMIT_ENABLED: Final = "compute_limit_enabled"
KEY_BURST_WHEN_ALONE: Final = "burst_when_alone"
KEY_PRIORITY: Final = "priority"
KEY_CONTEXT_OVERHEAD_BYTES: Final = "context_overhead_bytes"
KEY_MEMORY_HOST_FALLBACK: Final = "memory_host_fallback"
DEVICE_KEY_PREFIX: Final = "device."
DEVICE_KEY_UUID: Final = "uuid"
DEVICE_KEY_MEMORY_LIMIT_BYTES: Final = "memory_limit_bytes"
DEVICE_KEY_CORE_LIMIT: Final = "core_limit"
DEVICE_KEY_CORE_LIMIT_MAX: Final = "core_limit_max"
MODE_SLICED: Final = "sliced"
MODE_WHOLE: Final = "whole"
PRIORITY_HIGH: Final = 0
PRIORITY_LOW: Final = 1
DEFAULT_PRIORITY: Final = 1
DEFAULT_COMPUTE_LIMIT_ENABLED: Final = 1
DEFAULT_BURST_WHEN_ALONE: Final = 0
DEFAULT_CONTEXT_OVERHEAD_BYTES: Final = 0
DEFAULT_MEMORY_HOST_FALLBACK: Final = 0
MAX_STRING: Final = 253
UUID_MAX: Final = 64

ENV_MEMORY_LIMIT: Final = "FRACGPU_MEMORY_LIMIT"
ENV_CORE_LIMIT: Final = "FRACGPU_CORE_LIMIT"
ENV_LOG_LEVEL: Final = "FRACGPU_LOG_LEVEL"

# ---- shared region ----
REGION_MAGIC: Final = 0x3155504743415246  # "FRACGPU1" little-endian
REGION_VERSION: Final = 2
REGION_SIZE: Final = 131072
MAX_DEVICES: Final = 16
MAX_PROCS: Final = 256

HDR_OFF_MAGIC: Final = 0
HDR_OFF_VERSION: Final = 8
HDR_OFF_REGION_SIZE: Final = 12
HDR_OFF_MAX_DEVICES: Final = 16
HDR_OFF_MAX_PROCS: Final = 20
HDR_OFF_DEVICE_COUNT: Final = 24
HDR_OFF_PRIORITY: Final = 28
HDR_OFF_CREATED_NS: Final = 32
HDR_OFF_RECLAIMED_PROCS: Final = 40
HDR_OFF_LOCK: Final = 64
HDR_LOCK_SIZE: Final = 64
HDR_SIZE: Final = 256

DEVICES_OFF: Final = 256
DEV_SIZE: Final = 192
DEV_OFF_UUID: Final = 0
DEV_UUID_SIZE: Final = 48
DEV_OFF_MEMORY_LIMIT: Final = 48
DEV_OFF_MEMORY_USED: Final = 56
DEV_OFF_MEMORY_PEAK: Final = 64
DEV_OFF_OOM_REJECTIONS: Final = 72
DEV_OFF_KERNEL_LAUNCHES: Final = 80
DEV_OFF_KERNEL_TIME_NS: Final = 88
DEV_OFF_THROTTLE_NS: Final = 96
DEV_OFF_PACE_TAT_NS: Final = 104
DEV_OFF_CORE_LIMIT: Final = 112
DEV_OFF_ACTIVE_LAUNCH_NS: Final = 120
DEV_OFF_MEMORY_HOST_USED: Final = 128
DEV_OFF_HOST_ALLOCATIONS: Final = 136

SLOTS_OFF: Final = 3328
# The part of a region the agent reads for the boards: the header and the devices.
REGION_HEAD_SIZE: Final = 3328
SLOT_SIZE: Final = 320
SLOT_OFF_PID: Final = 0
SLOT_OFF_STATE: Final = 4
SLOT_OFF_START_TIME: Final = 8
SLOT_OFF_USED: Final = 16
SLOT_OFF_HOST_USED: Final = 144
SLOT_STATE_FREE: Final = 0
SLOT_STATE_ACTIVE: Final = 1

# ---- node priority board (one file per GPU in NODE_DIR, written by the agent only) ----
NODE_DIR: Final = names.CONTAINER_NODE_DIR
BOARD_MAGIC: Final = 0x45444F4E43415246  # "FRACNODE" little-endian
BOARD_VERSION: Final = 2
BOARD_SIZE: Final = 4096
BOARD_OFF_MAGIC: Final = 0
BOARD_OFF_VERSION: Final = 8
BOARD_OFF_SIZE: Final = 12
BOARD_OFF_HIGH_ACTIVE_UNTIL_NS: Final = 16
BOARD_OFF_PUBLISHED_NS: Final = 24
BOARD_OFF_SEQUENCE: Final = 32
BOARD_OFF_ENTRY_COUNT: Final = 40
BOARD_HIGH_HOLD_NS: Final = 50_000_000
BOARD_OFF_ENTRIES: Final = 64
BOARD_ENTRY_SIZE: Final = 16
BOARD_MAX_ENTRIES: Final = 64
BOARD_OFF_SEQUENCE_END: Final = 1088
BOARD_READ_SIZE: Final = 1096
BOARD_ALONE_NS: Final = 1_000_000_000
BOARD_STALE_NS: Final = 2_000_000_000
BOARD_REFRESH_NS: Final = 2_000_000

_UUID_RE: Final = re.compile(r"[A-Za-z0-9-]{1,63}")
_UINT_RE: Final = re.compile(r"[0-9]{1,20}")
_DEVICE_KEY_RE: Final = re.compile(r"device\.(0|[1-9][0-9]?)\.([a-z_]+)")
_DEVICE_FIELDS: Final = (
    DEVICE_KEY_UUID,
    DEVICE_KEY_MEMORY_LIMIT_BYTES,
    DEVICE_KEY_CORE_LIMIT,
    DEVICE_KEY_CORE_LIMIT_MAX,
)
_WHAT_LIMITS: Final = "shim limits file"
_WHAT_REGION: Final = "shim region"
_WHAT_BOARD: Final = "shim priority board"


@dataclass(frozen=True)
class DeviceLimits:
    """One GPU of the container and its slice."""

    uuid: str
    memory_limit_bytes: int
    core_limit: int = 100
    core_limit_max: int | None = None

    @property
    def effective_core_limit_max(self) -> int:
        return self.core_limit if self.core_limit_max is None else self.core_limit_max


@dataclass(frozen=True)
class Limits:
    """The content of one container's limits file."""

    devices: tuple[DeviceLimits, ...] = ()
    whole: bool = False
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    pod_uid: str | None = None
    compute_limit_enabled: bool = bool(DEFAULT_COMPUTE_LIMIT_ENABLED)
    burst_when_alone: bool = bool(DEFAULT_BURST_WHEN_ALONE)
    priority: int = DEFAULT_PRIORITY
    context_overhead_bytes: int = DEFAULT_CONTEXT_OVERHEAD_BYTES
    # Allocations within the slice are served from host memory once the GPU is full
    # (memory scaling > 1 lets the slices on a GPU add up to more than it has).
    memory_host_fallback: bool = bool(DEFAULT_MEMORY_HOST_FALLBACK)


def _fail(problem: str) -> CodecError:
    return CodecError(_WHAT_LIMITS, problem)


def _check_string(key: str, value: str) -> None:
    size = len(value.encode())
    if not 1 <= size <= MAX_STRING or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise _fail(f"{key}={value!r}: 1..{MAX_STRING} printable characters are allowed")
    if value != value.strip(" \t"):
        raise _fail(f"{key}={value!r}: leading or trailing blanks are not allowed")


def _check_limits(limits: Limits) -> None:
    if not limits.whole and not limits.devices:
        raise _fail("a sliced container needs at least one device")
    if len(limits.devices) > MAX_DEVICES:
        raise _fail(f"{len(limits.devices)} devices given, at most {MAX_DEVICES} are allowed")
    if limits.priority not in (PRIORITY_HIGH, PRIORITY_LOW):
        raise _fail(f"priority={limits.priority}: 0 (high) or 1 (low) is allowed")
    if not 0 <= limits.context_overhead_bytes < 2**64:
        raise _fail("context_overhead_bytes must be an unsigned 64-bit number")
    seen: set[str] = set()
    for i, dev in enumerate(limits.devices):
        if not _UUID_RE.fullmatch(dev.uuid):
            raise _fail(f"device {i} uuid {dev.uuid!r}: letters, digits and '-' are allowed")
        if dev.uuid.lower() in seen:
            raise _fail(f"device UUID {dev.uuid!r} listed twice")
        seen.add(dev.uuid.lower())
        if not 1 <= dev.memory_limit_bytes < 2**64:
            raise _fail(f"device {i} memory_limit_bytes={dev.memory_limit_bytes}: 1..2^64-1")
        if not 1 <= dev.core_limit <= 100:
            raise _fail(f"device {i} core_limit={dev.core_limit}: a percentage 1..100")
        if not dev.core_limit <= dev.effective_core_limit_max <= 100:
            raise _fail(f"device {i} core_limit_max must be between core_limit and 100")
    for key, value in (
        (KEY_NAMESPACE, limits.namespace),
        (KEY_POD, limits.pod),
        (KEY_CONTAINER, limits.container),
        (KEY_POD_UID, limits.pod_uid),
    ):
        if value is not None:
            _check_string(key, value)


def encode_limits(limits: Limits) -> bytes:
    """The limits file the agent writes for one container."""
    _check_limits(limits)
    lines = [f"{KEY_VERSION}={LIMITS_VERSION}"]
    lines.append(f"{KEY_MODE}={MODE_WHOLE if limits.whole else MODE_SLICED}")
    for key, value in (
        (KEY_NAMESPACE, limits.namespace),
        (KEY_POD, limits.pod),
        (KEY_CONTAINER, limits.container),
        (KEY_POD_UID, limits.pod_uid),
    ):
        if value is not None:
            lines.append(f"{key}={value}")
    lines.append(f"{KEY_COMPUTE_LIMIT_ENABLED}={int(limits.compute_limit_enabled)}")
    lines.append(f"{KEY_BURST_WHEN_ALONE}={int(limits.burst_when_alone)}")
    lines.append(f"{KEY_PRIORITY}={limits.priority}")
    lines.append(f"{KEY_CONTEXT_OVERHEAD_BYTES}={limits.context_overhead_bytes}")
    if limits.memory_host_fallback:
        # Written only when on, so files without it stay readable by older shims.
        lines.append(f"{KEY_MEMORY_HOST_FALLBACK}=1")
    lines.append(f"{KEY_DEVICE_COUNT}={len(limits.devices)}")
    for i, dev in enumerate(limits.devices):
        prefix = f"{DEVICE_KEY_PREFIX}{i}."
        lines.append(f"{prefix}{DEVICE_KEY_UUID}={dev.uuid}")
        lines.append(f"{prefix}{DEVICE_KEY_MEMORY_LIMIT_BYTES}={dev.memory_limit_bytes}")
        lines.append(f"{prefix}{DEVICE_KEY_CORE_LIMIT}={dev.core_limit}")
        if dev.core_limit_max is not None:
            lines.append(f"{prefix}{DEVICE_KEY_CORE_LIMIT_MAX}={dev.core_limit_max}")
    data = ("\n".join(lines) + "\n").encode()
    if len(data) > LIMITS_MAX_BYTES:
        raise _fail(f"encoded file is {len(data)} bytes, at most {LIMITS_MAX_BYTES} allowed")
    return data


def _uint(key: str, value: str, low: int, high: int) -> int:
    if not _UINT_RE.fullmatch(value) or not low <= int(value) <= high:
        raise _fail(f"{key}={value!r}: a whole number {low}..{high} is allowed")
    return int(value)


def _split_lines(data: bytes) -> list[tuple[int, str, str]]:
    if len(data) > LIMITS_MAX_BYTES:
        raise _fail(f"file is larger than {LIMITS_MAX_BYTES} bytes")
    if b"\0" in data:
        raise _fail("file contains a NUL byte")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise _fail(f"not UTF-8 ({exc.reason})") from exc
    out: list[tuple[int, str, str]] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        if len(raw.encode()) > LIMITS_MAX_LINE:
            raise _fail(f"line {number} is longer than {LIMITS_MAX_LINE} bytes")
        line = raw.strip(" \t").rstrip(" \t\r")
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise _fail(f"line {number}: expected key=value, got {line[:64]!r}")
        out.append((number, key.lstrip(" \t").rstrip(" \t\r"), value.lstrip(" \t").rstrip(" \t\r")))
    return out


def decode_limits(data: bytes) -> Limits:
    """Read a limits file with the same rules as the shim's C parser."""
    entries = _split_lines(data)
    if not entries:
        raise _fail("empty limits file: expected version=1 first")
    number, key, value = entries[0]
    if key != KEY_VERSION:
        raise _fail(f"line {number}: the first setting must be version=1, got {key!r}")
    if value != str(LIMITS_VERSION):
        raise _fail(f"unsupported limits version {value!r} (version {LIMITS_VERSION} is read)")
    top: dict[str, str] = {}
    devices: dict[int, dict[str, str]] = {}
    for number, key, value in entries[1:]:
        match = _DEVICE_KEY_RE.fullmatch(key)
        if key.startswith(DEVICE_KEY_PREFIX):
            if match is None or int(match.group(1)) >= MAX_DEVICES:
                raise _fail(f"line {number}: bad device key {key!r}")
            if match.group(2) not in _DEVICE_FIELDS:
                raise _fail(f"line {number}: unknown device field in {key!r}")
            fields = devices.setdefault(int(match.group(1)), {})
            if match.group(2) in fields:
                raise _fail(f"line {number}: duplicate key {key!r}")
            fields[match.group(2)] = value
            continue
        if key not in _TOP_KEYS:
            raise _fail(f"line {number}: unknown key {key!r}")
        if key in top or key == KEY_VERSION:
            raise _fail(f"line {number}: duplicate key {key!r}")
        top[key] = value
    return _build_limits(top, devices)


_TOP_KEYS: Final = frozenset(
    {
        KEY_VERSION,
        KEY_MODE,
        KEY_NAMESPACE,
        KEY_POD,
        KEY_CONTAINER,
        KEY_POD_UID,
        KEY_DEVICE_COUNT,
        KEY_COMPUTE_LIMIT_ENABLED,
        KEY_BURST_WHEN_ALONE,
        KEY_PRIORITY,
        KEY_CONTEXT_OVERHEAD_BYTES,
        KEY_MEMORY_HOST_FALLBACK,
    }
)


def _build_limits(top: dict[str, str], devices: dict[int, dict[str, str]]) -> Limits:
    mode = top.get(KEY_MODE, MODE_SLICED)
    if mode not in (MODE_SLICED, MODE_WHOLE):
        raise _fail(f"mode={mode!r}: {MODE_SLICED} or {MODE_WHOLE} is allowed")
    whole = mode == MODE_WHOLE
    if KEY_DEVICE_COUNT not in top and not whole:
        raise _fail("missing device_count")
    count = _uint(KEY_DEVICE_COUNT, top.get(KEY_DEVICE_COUNT, "0"), 0, MAX_DEVICES)
    extra = sorted(i for i in devices if i >= count)
    if extra:
        raise _fail(f"device.{extra[0]}.* given but device_count is {count}")
    parsed: list[DeviceLimits] = []
    for i in range(count):
        fields = devices.get(i, {})
        for needed in (DEVICE_KEY_UUID, DEVICE_KEY_MEMORY_LIMIT_BYTES):
            if needed not in fields:
                raise _fail(f"missing device.{i}.{needed}")
        core_max = fields.get(DEVICE_KEY_CORE_LIMIT_MAX)
        parsed.append(
            DeviceLimits(
                uuid=fields[DEVICE_KEY_UUID],
                memory_limit_bytes=_uint(
                    DEVICE_KEY_MEMORY_LIMIT_BYTES,
                    fields[DEVICE_KEY_MEMORY_LIMIT_BYTES],
                    1,
                    2**64 - 1,
                ),
                core_limit=_uint(
                    DEVICE_KEY_CORE_LIMIT, fields.get(DEVICE_KEY_CORE_LIMIT, "100"), 1, 100
                ),
                core_limit_max=None
                if core_max is None
                else _uint(DEVICE_KEY_CORE_LIMIT_MAX, core_max, 1, 100),
            )
        )
    limits = Limits(
        devices=tuple(parsed),
        whole=whole,
        namespace=top.get(KEY_NAMESPACE),
        pod=top.get(KEY_POD),
        container=top.get(KEY_CONTAINER),
        pod_uid=top.get(KEY_POD_UID),
        compute_limit_enabled=_uint(
            KEY_COMPUTE_LIMIT_ENABLED,
            top.get(KEY_COMPUTE_LIMIT_ENABLED, str(DEFAULT_COMPUTE_LIMIT_ENABLED)),
            0,
            1,
        )
        == 1,
        burst_when_alone=_uint(
            KEY_BURST_WHEN_ALONE,
            top.get(KEY_BURST_WHEN_ALONE, str(DEFAULT_BURST_WHEN_ALONE)),
            0,
            1,
        )
        == 1,
        priority=_uint(KEY_PRIORITY, top.get(KEY_PRIORITY, str(DEFAULT_PRIORITY)), 0, 1),
        context_overhead_bytes=_uint(
            KEY_CONTEXT_OVERHEAD_BYTES,
            top.get(KEY_CONTEXT_OVERHEAD_BYTES, str(DEFAULT_CONTEXT_OVERHEAD_BYTES)),
            0,
            2**64 - 1,
        ),
        memory_host_fallback=_uint(
            KEY_MEMORY_HOST_FALLBACK,
            top.get(KEY_MEMORY_HOST_FALLBACK, str(DEFAULT_MEMORY_HOST_FALLBACK)),
            0,
            1,
        )
        == 1,
    )
    _check_limits(limits)
    return limits


# ---- region ----


@dataclass(frozen=True)
class RegionDevice:
    """Per-GPU usage and counters of one container.

    memory_used counts device and host memory; memory_host_used is the part of it the
    shim served from host memory (host fallback), host_allocations how many
    allocations it served from there since the region was created.
    """

    uuid: str
    memory_limit: int
    memory_used: int
    memory_peak: int
    oom_rejections: int
    kernel_launches: int
    kernel_time_ns: int
    throttle_ns: int
    core_limit: int
    memory_host_used: int = 0
    host_allocations: int = 0


@dataclass(frozen=True)
class RegionProcess:
    """One process of the container that holds a slot."""

    pid: int
    start_time: int
    used: tuple[int, ...]
    host_used: tuple[int, ...] = ()


@dataclass(frozen=True)
class Region:
    """A snapshot of the shared accounting region."""

    version: int
    device_count: int
    priority: int
    created_ns: int
    reclaimed_procs: int
    devices: tuple[RegionDevice, ...]
    processes: tuple[RegionProcess, ...]


@dataclass(frozen=True)
class BoardEntry:
    """One container on a GPU: its id (its region's creation time; 0 when two
    containers claim the same id) and when it last launched work."""

    id: int
    last_active_ns: int


@dataclass(frozen=True)
class Board:
    """A GPU's board, as the agent publishes it to every container on the GPU."""

    high_active_until_ns: int
    published_ns: int
    sequence: int
    entries: tuple[BoardEntry, ...] = ()


_U64_MAX: Final = (1 << 64) - 1


def encode_board(board: Board) -> bytes:
    """The whole board file (BOARD_SIZE bytes); the sequence is written at both ends."""
    if len(board.entries) > BOARD_MAX_ENTRIES:
        raise CodecError(
            _WHAT_BOARD, f"{len(board.entries)} entries, at most {BOARD_MAX_ENTRIES} fit"
        )
    values = [board.high_active_until_ns, board.published_ns, board.sequence]
    values += [v for e in board.entries for v in (e.id, e.last_active_ns)]
    if any(not 0 <= v <= _U64_MAX for v in values):
        raise CodecError(_WHAT_BOARD, "every value must fit in 64 unsigned bits")
    buf = bytearray(BOARD_SIZE)
    struct.pack_into("<QII", buf, BOARD_OFF_MAGIC, BOARD_MAGIC, BOARD_VERSION, BOARD_SIZE)
    struct.pack_into(
        "<QQQI",
        buf,
        BOARD_OFF_HIGH_ACTIVE_UNTIL_NS,
        board.high_active_until_ns,
        board.published_ns,
        board.sequence,
        len(board.entries),
    )
    for i, entry in enumerate(board.entries):
        struct.pack_into(
            "<QQ", buf, BOARD_OFF_ENTRIES + i * BOARD_ENTRY_SIZE, entry.id, entry.last_active_ns
        )
    struct.pack_into("<Q", buf, BOARD_OFF_SEQUENCE_END, board.sequence)
    return bytes(buf)


def decode_board(data: bytes) -> Board:
    """Decode a board file; refuses other magics, versions, sizes, entry counts and
    boards read while being written (sequence at both ends differs)."""
    if len(data) != BOARD_SIZE:
        raise CodecError(_WHAT_BOARD, f"{len(data)} bytes, exactly {BOARD_SIZE} expected")
    magic, version = _u64(data, BOARD_OFF_MAGIC), _u32(data, BOARD_OFF_VERSION)
    if magic != BOARD_MAGIC or version != BOARD_VERSION:
        raise CodecError(_WHAT_BOARD, f"not a version {BOARD_VERSION} board")
    if _u32(data, BOARD_OFF_SIZE) != BOARD_SIZE:
        raise CodecError(_WHAT_BOARD, f"header size is not {BOARD_SIZE}")
    sequence = _u64(data, BOARD_OFF_SEQUENCE)
    if sequence != _u64(data, BOARD_OFF_SEQUENCE_END):
        raise CodecError(_WHAT_BOARD, "torn: the sequence at its two ends differs")
    count = _u32(data, BOARD_OFF_ENTRY_COUNT)
    if count > BOARD_MAX_ENTRIES:
        raise CodecError(_WHAT_BOARD, f"{count} entries, at most {BOARD_MAX_ENTRIES} fit")
    return Board(
        high_active_until_ns=_u64(data, BOARD_OFF_HIGH_ACTIVE_UNTIL_NS),
        published_ns=_u64(data, BOARD_OFF_PUBLISHED_NS),
        sequence=sequence,
        entries=tuple(
            BoardEntry(
                _u64(data, BOARD_OFF_ENTRIES + i * BOARD_ENTRY_SIZE),
                _u64(data, BOARD_OFF_ENTRIES + i * BOARD_ENTRY_SIZE + 8),
            )
            for i in range(count)
        ),
    )


@dataclass(frozen=True)
class RegionActivity:
    """What the boards need from one container's region: its id and, per device in
    limits order, when it last launched work (CLOCK_MONOTONIC ns; 0: never)."""

    created_ns: int
    active_launch_ns: tuple[int, ...]


def decode_region_activity(data: bytes) -> RegionActivity:
    """Decode the head of a region (REGION_HEAD_SIZE bytes or more)."""
    count = _check_region_header(data, exact=False)
    return RegionActivity(
        created_ns=_u64(data, HDR_OFF_CREATED_NS),
        active_launch_ns=tuple(
            _u64(data, DEVICES_OFF + i * DEV_SIZE + DEV_OFF_ACTIVE_LAUNCH_NS) for i in range(count)
        ),
    )


def _u32(data: bytes, off: int) -> int:
    return int(struct.unpack_from("<I", data, off)[0])


def _u64(data: bytes, off: int) -> int:
    return int(struct.unpack_from("<Q", data, off)[0])


def _check_region_header(data: bytes, *, exact: bool = True) -> int:
    """Refuse a region whose header does not describe this layout; returns device count.

    exact=False accepts the head of a region (at least REGION_HEAD_SIZE bytes)."""
    if exact and len(data) != REGION_SIZE:
        raise CodecError(_WHAT_REGION, f"{len(data)} bytes, exactly {REGION_SIZE} expected")
    if not exact and not REGION_HEAD_SIZE <= len(data) <= REGION_SIZE:
        raise CodecError(
            _WHAT_REGION, f"{len(data)} bytes, {REGION_HEAD_SIZE} to {REGION_SIZE} expected"
        )
    magic, version = _u64(data, HDR_OFF_MAGIC), _u32(data, HDR_OFF_VERSION)
    if magic != REGION_MAGIC:
        raise CodecError(_WHAT_REGION, f"magic {magic:#x}, {REGION_MAGIC:#x} expected")
    if version != REGION_VERSION:
        raise CodecError(_WHAT_REGION, f"version {version}, version {REGION_VERSION} is read")
    for field, offset, expected in (
        ("region_size", HDR_OFF_REGION_SIZE, REGION_SIZE),
        ("max_devices", HDR_OFF_MAX_DEVICES, MAX_DEVICES),
        ("max_procs", HDR_OFF_MAX_PROCS, MAX_PROCS),
    ):
        value = _u32(data, offset)
        if value != expected:
            raise CodecError(
                _WHAT_REGION, f"header field {field} is {value}, exactly {expected} is allowed"
            )
    count = _u32(data, HDR_OFF_DEVICE_COUNT)
    if count > MAX_DEVICES:
        raise CodecError(
            _WHAT_REGION, f"header field device_count is {count}, at most {MAX_DEVICES} is allowed"
        )
    return count


def decode_region(data: bytes) -> Region:
    """Decode a region snapshot; refuses other magics, versions, sizes and device counts."""
    count = _check_region_header(data)
    devices = []
    for i in range(count):
        base = DEVICES_OFF + i * DEV_SIZE
        raw_uuid = data[base + DEV_OFF_UUID : base + DEV_OFF_UUID + DEV_UUID_SIZE]
        devices.append(
            RegionDevice(
                uuid=raw_uuid.split(b"\0", 1)[0].decode(errors="replace"),
                memory_limit=_u64(data, base + DEV_OFF_MEMORY_LIMIT),
                memory_used=_u64(data, base + DEV_OFF_MEMORY_USED),
                memory_peak=_u64(data, base + DEV_OFF_MEMORY_PEAK),
                oom_rejections=_u64(data, base + DEV_OFF_OOM_REJECTIONS),
                kernel_launches=_u64(data, base + DEV_OFF_KERNEL_LAUNCHES),
                kernel_time_ns=_u64(data, base + DEV_OFF_KERNEL_TIME_NS),
                throttle_ns=_u64(data, base + DEV_OFF_THROTTLE_NS),
                core_limit=_u32(data, base + DEV_OFF_CORE_LIMIT),
                memory_host_used=_u64(data, base + DEV_OFF_MEMORY_HOST_USED),
                host_allocations=_u64(data, base + DEV_OFF_HOST_ALLOCATIONS),
            )
        )
    processes = []
    for s in range(MAX_PROCS):
        base = SLOTS_OFF + s * SLOT_SIZE
        if _u32(data, base + SLOT_OFF_STATE) != SLOT_STATE_ACTIVE:
            continue
        processes.append(
            RegionProcess(
                pid=struct.unpack_from("<i", data, base + SLOT_OFF_PID)[0],
                start_time=_u64(data, base + SLOT_OFF_START_TIME),
                used=tuple(_u64(data, base + SLOT_OFF_USED + 8 * d) for d in range(count)),
                host_used=tuple(
                    _u64(data, base + SLOT_OFF_HOST_USED + 8 * d) for d in range(count)
                ),
            )
        )
    return Region(
        version=REGION_VERSION,
        device_count=count,
        priority=_u32(data, HDR_OFF_PRIORITY),
        created_ns=_u64(data, HDR_OFF_CREATED_NS),
        reclaimed_procs=_u64(data, HDR_OFF_RECLAIMED_PROCS),
        devices=tuple(devices),
        processes=tuple(processes),
    )
