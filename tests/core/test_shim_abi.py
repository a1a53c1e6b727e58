"""The Python side of the shim ABI matches the C header and round-trips."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fracgpu import shim_abi
from fracgpu.errors import CodecError

HEADER = Path(__file__).resolve().parents[2] / "shim" / "include" / "fracgpu_abi.h"
_DEFINE = re.compile(r"^#define\s+FRACGPU_([A-Z0-9_]+)\s+(.+?)\s*(?:/\*.*)?$")
_NOT_ABI = {"ABI_H"}


def header_defines() -> dict[str, int | str]:
    values: dict[str, int | str] = {}
    for line in HEADER.read_text().splitlines():
        match = _DEFINE.match(line)
        if match is None or match.group(1) in _NOT_ABI:
            continue
        raw = match.group(2)
        if raw.startswith('"'):
            values[match.group(1)] = raw.strip('"')
        else:
            values[match.group(1)] = int(raw.rstrip("ULul"), 0)
    return values


def test_header_has_abi_values() -> None:
    defines = header_defines()
    assert len(defines) > 60
    assert defines["REGION_VERSION"] == 2


@pytest.mark.parametrize("name", sorted(header_defines()))
def test_every_header_value_matches_python(name: str) -> None:
    assert hasattr(shim_abi, name), f"fracgpu.shim_abi lacks {name} from the C header"
    assert getattr(shim_abi, name) == header_defines()[name]


def test_every_python_constant_is_in_the_header() -> None:
    defines = header_defines()
    constants = [n for n in vars(shim_abi) if re.fullmatch(r"[A-Z][A-Z0-9_]+", n)]
    assert constants
    assert sorted(n for n in constants if n not in defines) == []


def test_region_layout_is_consistent() -> None:
    a = shim_abi
    assert a.DEVICES_OFF == a.HDR_SIZE
    assert a.SLOTS_OFF == a.DEVICES_OFF + a.MAX_DEVICES * a.DEV_SIZE
    assert a.SLOTS_OFF + a.MAX_PROCS * a.SLOT_SIZE <= a.REGION_SIZE
    assert a.SLOT_OFF_USED + 8 * a.MAX_DEVICES == a.SLOT_OFF_HOST_USED
    assert a.SLOT_OFF_HOST_USED + 8 * a.MAX_DEVICES <= a.SLOT_SIZE
    assert a.DEV_OFF_ACTIVE_LAUNCH_NS + 8 == a.DEV_OFF_MEMORY_HOST_USED
    assert a.DEV_OFF_HOST_ALLOCATIONS + 8 <= a.DEV_SIZE
    assert a.HDR_OFF_LOCK + a.HDR_LOCK_SIZE <= a.HDR_SIZE
    # The new u64 fields are naturally aligned (C updates them with plain atomics).
    for offset in (a.DEV_OFF_MEMORY_HOST_USED, a.DEV_OFF_HOST_ALLOCATIONS, a.SLOT_OFF_HOST_USED):
        assert offset % 8 == 0
    assert a.DEV_SIZE % 8 == 0 and a.SLOT_SIZE % 8 == 0 and a.REGION_SIZE % 4096 == 0


def test_magic_spells_the_format_name() -> None:
    assert struct.pack("<Q", shim_abi.REGION_MAGIC) == b"FRACGPU1"
    assert struct.pack("<Q", shim_abi.BOARD_MAGIC) == b"FRACNODE"


def test_board_round_trip_and_refusals() -> None:
    board = shim_abi.Board(5, 6, 7, (shim_abi.BoardEntry(1, 2), shim_abi.BoardEntry(0, 3)))
    data = shim_abi.encode_board(board)
    assert len(data) == shim_abi.BOARD_SIZE
    assert shim_abi.decode_board(data) == board
    with pytest.raises(CodecError, match="version 2 board"):
        shim_abi.decode_board(bytes(shim_abi.BOARD_SIZE))
    torn = bytearray(data)
    struct.pack_into("<Q", torn, shim_abi.BOARD_OFF_SEQUENCE_END, 8)
    with pytest.raises(CodecError, match="torn"):
        shim_abi.decode_board(bytes(torn))
    with pytest.raises(CodecError, match="at most 64"):
        shim_abi.encode_board(shim_abi.Board(0, 0, 0, (shim_abi.BoardEntry(1, 1),) * 65))


SAMPLE = shim_abi.Limits(
    devices=(
        shim_abi.DeviceLimits("GPU-aaaa", 1 << 30, 30, 60),
        shim_abi.DeviceLimits("GPU-bbbb", 2 << 30),
    ),
    namespace="team-a",
    pod="trainer-0",
    container="main",
    pod_uid="0e6f1c2a-1111-2222-3333-444455556666",
    priority=0,
    context_overhead_bytes=300 << 20,
    memory_host_fallback=True,
)


def test_encode_starts_with_version_and_round_trips() -> None:
    data = shim_abi.encode_limits(SAMPLE)
    assert data.startswith(b"version=1\n")
    assert b"device.1.memory_limit_bytes=2147483648\n" in data
    assert b"memory_host_fallback=1\n" in data
    assert shim_abi.decode_limits(data) == SAMPLE


def test_host_fallback_is_off_unless_written() -> None:
    off = shim_abi.Limits(devices=(shim_abi.DeviceLimits("GPU-aaaa", 1 << 30),))
    data = shim_abi.encode_limits(off)
    assert b"memory_host_fallback" not in data  # older shims keep reading files without it
    assert not shim_abi.decode_limits(data).memory_host_fallback
    assert shim_abi.decode_limits(data + b"memory_host_fallback=1\n").memory_host_fallback
    assert not shim_abi.decode_limits(data + b"memory_host_fallback=0\n").memory_host_fallback


def test_whole_mode_needs_no_devices() -> None:
    data = shim_abi.encode_limits(shim_abi.Limits(whole=True))
    assert b"mode=whole" in data
    assert shim_abi.decode_limits(data).whole


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (b"", "empty"),
        (b"device_count=1\n", "first setting must be version=1"),
        (b"version=2\n", "unsupported limits version"),
        (b"version=1\n", "missing device_count"),
        (b"version=1\ndevice_count=1\n", "missing device.0.uuid"),
        (b"version=1\ndevice_count=1\ndevice.0.uuid=G\n", "missing device.0.memory_limit_bytes"),
        (b"version=1\nbogus=1\n", "unknown key"),
        (b"version=1\nmode=whole\nmode=whole\n", "duplicate key"),
        (b"version=1\nversion=1\n", "duplicate key"),
        (b"version=1\nmode=half\n", "mode='half'"),
        (b"version=1\nnonsense\n", "expected key=value"),
        (b"version=1\x00\n", "NUL"),
        (b"version=1\nmode=whole\npriority=2\n", "priority"),
        (b"version=1\ndevice_count=1\ndevice.0.uuid=G\ndevice.0.memory_limit_bytes=0\n", "memory"),
        (b"version=1\ndevice_count=1\ndevice.0.uuid=G\ndevice.0.memory_limit_bytes=-1\n", "memory"),
        (
            b"version=1\ndevice_count=1\ndevice.0.uuid=G\ndevice.0.memory_limit_bytes=1\n"
            b"device.0.core_limit=101\n",
            "core_limit",
        ),
        (b"version=1\ndevice_count=1\ndevice.1.uuid=G\n", "device.1"),
        (b"version=1\nmode=whole\ndevice.0.color=red\n", "unknown device field"),
        (b"version=1\nmode=whole\nmemory_host_fallback=2\n", "memory_host_fallback='2'"),
        (b"version=1\nmode=whole\nmemory_host_fallback=yes\n", "memory_host_fallback='yes'"),
        (
            b"version=1\nmode=whole\nmemory_host_fallback=1\nmemory_host_fallback=1\n",
            "duplicate key 'memory_host_fallback'",
        ),
    ],
)
def test_decode_rejects_bad_files_with_a_reason(text: bytes, problem: str) -> None:
    with pytest.raises(CodecError, match=re.escape(problem)):
        shim_abi.decode_limits(text)


def test_encode_rejects_out_of_range_values() -> None:
    with pytest.raises(CodecError, match="core_limit"):
        shim_abi.encode_limits(shim_abi.Limits(devices=(shim_abi.DeviceLimits("G", 1, 0),)))
    with pytest.raises(CodecError, match="pod"):
        shim_abi.encode_limits(shim_abi.Limits(whole=True, pod="a\nb"))
    with pytest.raises(CodecError, match="at least one device"):
        shim_abi.encode_limits(shim_abi.Limits())


uuids = st.from_regex(r"GPU-[0-9a-f]{8}", fullmatch=True)
names = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40
)


@given(
    devs=st.lists(
        st.tuples(uuids, st.integers(1, 2**64 - 1), st.integers(1, 100)),
        min_size=1,
        max_size=16,
        unique_by=lambda d: d[0],
    ),
    pod=names,
    priority=st.integers(0, 1),
)
def test_round_trip_property(devs: list[tuple[str, int, int]], pod: str, priority: int) -> None:
    limits = shim_abi.Limits(
        devices=tuple(shim_abi.DeviceLimits(u, m, c) for u, m, c in devs),
        pod=pod,
        priority=priority,
    )
    assert shim_abi.decode_limits(shim_abi.encode_limits(limits)) == limits


@given(st.binary(max_size=300))
def test_decode_accepts_or_explains_any_input(data: bytes) -> None:
    try:
        limits = shim_abi.decode_limits(b"version=1\n" + data)
    except CodecError as exc:
        assert str(exc).startswith("shim limits file: ")
    else:
        assert shim_abi.decode_limits(shim_abi.encode_limits(limits)) == limits


def make_region(used: int, pid: int, host: int = 0) -> bytearray:
    a = shim_abi
    buf = bytearray(a.REGION_SIZE)
    struct.pack_into("<QI", buf, a.HDR_OFF_MAGIC, a.REGION_MAGIC, a.REGION_VERSION)
    struct.pack_into(
        "<IIII", buf, a.HDR_OFF_REGION_SIZE, a.REGION_SIZE, a.MAX_DEVICES, a.MAX_PROCS, 1
    )
    buf[a.DEVICES_OFF : a.DEVICES_OFF + 8] = b"GPU-aaaa"
    struct.pack_into("<QQ", buf, a.DEVICES_OFF + a.DEV_OFF_MEMORY_LIMIT, 1 << 30, used)
    struct.pack_into("<Q", buf, a.DEVICES_OFF + a.DEV_OFF_OOM_REJECTIONS, 3)
    struct.pack_into("<QQ", buf, a.DEVICES_OFF + a.DEV_OFF_MEMORY_HOST_USED, host, 2)
    struct.pack_into("<iI", buf, a.SLOTS_OFF + a.SLOT_SIZE, pid, a.SLOT_STATE_ACTIVE)
    struct.pack_into("<Q", buf, a.SLOTS_OFF + a.SLOT_SIZE + a.SLOT_OFF_USED, used)
    struct.pack_into("<Q", buf, a.SLOTS_OFF + a.SLOT_SIZE + a.SLOT_OFF_HOST_USED, host)
    return buf


def test_decode_region_reads_devices_and_active_slots() -> None:
    region = shim_abi.decode_region(bytes(make_region(5 << 20, 4242, host=2 << 20)))
    assert region.version == 2
    assert region.devices[0].uuid == "GPU-aaaa"
    assert region.devices[0].memory_used == 5 << 20
    assert region.devices[0].memory_host_used == 2 << 20
    assert region.devices[0].host_allocations == 2
    assert region.devices[0].oom_rejections == 3
    assert [(p.pid, p.used, p.host_used) for p in region.processes] == [
        (4242, (5 << 20,), (2 << 20,))
    ]


def test_decode_region_refuses_other_versions_and_sizes() -> None:
    buf = make_region(0, 1)
    struct.pack_into("<I", buf, shim_abi.HDR_OFF_VERSION, 1)
    with pytest.raises(CodecError, match="version 1, version 2 is read"):
        shim_abi.decode_region(bytes(buf))
    with pytest.raises(CodecError, match="bytes"):
        shim_abi.decode_region(b"\0" * 10)
    with pytest.raises(CodecError, match="magic"):
        shim_abi.decode_region(bytes(shim_abi.REGION_SIZE))


# Issue #9: the header's size fields and device count are checked, not trusted.
@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [
        (shim_abi.HDR_OFF_REGION_SIZE, 65536, "header field region_size is 65536, exactly 131072"),
        (shim_abi.HDR_OFF_REGION_SIZE, 0, "header field region_size is 0, exactly 131072"),
        (shim_abi.HDR_OFF_MAX_DEVICES, 8, "header field max_devices is 8, exactly 16 is allowed"),
        (shim_abi.HDR_OFF_MAX_DEVICES, 17, "header field max_devices is 17, exactly 16"),
        (shim_abi.HDR_OFF_MAX_PROCS, 255, "header field max_procs is 255, exactly 256 is allowed"),
        (shim_abi.HDR_OFF_MAX_PROCS, 2**32 - 1, "header field max_procs is 4294967295"),
        (shim_abi.HDR_OFF_DEVICE_COUNT, 17, "header field device_count is 17, at most 16"),
        (shim_abi.HDR_OFF_DEVICE_COUNT, 2**32 - 1, "header field device_count is 4294967295"),
    ],
)
def test_decode_region_refuses_a_header_that_lies_about_its_layout(
    offset: int, value: int, message: str
) -> None:
    buf = make_region(1 << 20, 7)
    struct.pack_into("<I", buf, offset, value)
    with pytest.raises(CodecError, match=re.escape(f"shim region: {message}")):
        shim_abi.decode_region(bytes(buf))


@given(
    field=st.sampled_from(
        [
            (shim_abi.HDR_OFF_REGION_SIZE, shim_abi.REGION_SIZE),
            (shim_abi.HDR_OFF_MAX_DEVICES, shim_abi.MAX_DEVICES),
            (shim_abi.HDR_OFF_MAX_PROCS, shim_abi.MAX_PROCS),
        ]
    ),
    value=st.integers(0, 2**32 - 1),
    device_count=st.integers(0, 2**32 - 1),
)
def test_decode_region_accepts_exactly_the_documented_header(
    field: tuple[int, int], value: int, device_count: int
) -> None:
    offset, expected = field
    buf = make_region(0, 7)
    struct.pack_into("<I", buf, offset, value)
    struct.pack_into("<I", buf, shim_abi.HDR_OFF_DEVICE_COUNT, device_count)
    valid = value == expected and device_count <= shim_abi.MAX_DEVICES
    try:
        region = shim_abi.decode_region(bytes(buf))
    except CodecError as exc:
        assert not valid, exc
        assert "header field" in str(exc)
    else:
        assert valid
        assert region.device_count == device_count == len(region.devices)
