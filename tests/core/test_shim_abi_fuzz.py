"""Fuzz the agent-side decoders of fracgpu.shim_abi with arbitrary and mutated bytes.

A container can write anything into its region and the priority board, and a broken
agent could write anything into a limits file: every decoder must either return a value
that keeps the documented bounds or raise CodecError with a message, never IndexError,
struct.error, UnicodeDecodeError or the like. Run with -s to see how many inputs each
test tried.
"""

from __future__ import annotations

import random
import struct
from collections import Counter
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fracgpu import shim_abi
from fracgpu.errors import CodecError

FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Bytes that move a limits file across its rules: separators, blanks, digits at the
# bounds, non-UTF-8, NUL, key fragments.
TOKENS = [
    b"=",
    b"\n",
    b"\r",
    b"\t",
    b" ",
    b"#",
    b"\0",
    b"\xff",
    b"\xc3",
    b"0",
    b"1",
    b"9",
    b"101",
    b"16",
    b"18446744073709551616",
    b"device.",
    b"device.16.",
    b"device.01.",
    b".uuid=",
    b"core_limit_max",
    b"memory_host_fallback=",
    b"version=1\n",
    b"mode=whole\n",
    b"x" * 300,
]

_device = st.integers(1, 100).flatmap(
    lambda core: st.builds(
        shim_abi.DeviceLimits,
        uuid=st.from_regex(r"GPU-[0-9a-fA-F-]{1,40}", fullmatch=True),
        memory_limit_bytes=st.integers(1, 2**64 - 1),
        core_limit=st.just(core),
        core_limit_max=st.none() | st.integers(core, 100),
    )
)
_name = st.none() | st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40
).filter(bool)
valid_limits = st.builds(
    shim_abi.Limits,
    devices=st.lists(_device, min_size=1, max_size=4, unique_by=lambda d: d.uuid.lower()).map(
        tuple
    ),
    whole=st.booleans(),
    namespace=_name,
    pod=_name,
    container=_name,
    pod_uid=_name,
    compute_limit_enabled=st.booleans(),
    burst_when_alone=st.booleans(),
    priority=st.integers(0, 1),
    context_overhead_bytes=st.integers(0, 2**64 - 1),
    memory_host_fallback=st.booleans(),
)
edits = st.lists(
    st.tuples(
        st.integers(0, 2000), st.integers(0, 6), st.sampled_from(TOKENS) | st.binary(max_size=6)
    ),
    min_size=1,
    max_size=5,
)


def _mutate(data: bytes, changes: list[tuple[int, int, bytes]]) -> bytes:
    for at, cut, insert in changes:
        pos = at % (len(data) + 1)
        data = data[:pos] + insert + data[pos + cut :]
    return data


def _outcome(decode: Callable[[bytes], object], data: bytes) -> tuple[str, object]:
    """Decode, or return the refusal; any other exception fails the test."""
    try:
        return "decoded", decode(data)
    except CodecError as exc:
        assert exc.problem, f"refusal without a message for {data[:80]!r}"
        return "refused", exc


def _check_limits_bounds(limits: shim_abi.Limits) -> None:
    assert limits.whole or 1 <= len(limits.devices) <= shim_abi.MAX_DEVICES
    assert limits.priority in (0, 1)
    assert 0 <= limits.context_overhead_bytes < 2**64
    for dev in limits.devices:
        assert 1 <= dev.memory_limit_bytes < 2**64
        assert 1 <= dev.core_limit <= dev.effective_core_limit_max <= 100
    # What was decoded writes back to an equal file: nothing widened on the way.
    assert shim_abi.decode_limits(shim_abi.encode_limits(limits)) == limits


def test_limits_decoder_on_arbitrary_bytes() -> None:
    tried: Counter[str] = Counter()

    @FUZZ
    @given(
        data=st.binary(max_size=400) | st.lists(st.sampled_from(TOKENS), max_size=30).map(b"".join)
    )
    def run(data: bytes) -> None:
        kind, value = _outcome(shim_abi.decode_limits, data)
        tried[kind] += 1
        if isinstance(value, shim_abi.Limits):
            _check_limits_bounds(value)

    run()
    print(f"\ndecode_limits, arbitrary bytes: {dict(tried)}")
    assert tried["refused"] > 0


def test_limits_decoder_on_mutated_valid_files() -> None:
    tried: Counter[str] = Counter()

    @FUZZ
    @given(limits=valid_limits, changes=edits)
    def run(limits: shim_abi.Limits, changes: list[tuple[int, int, bytes]]) -> None:
        encoded = shim_abi.encode_limits(limits)
        assert shim_abi.decode_limits(encoded) == limits
        kind, value = _outcome(shim_abi.decode_limits, _mutate(encoded, changes))
        tried[kind] += 1
        if isinstance(value, shim_abi.Limits):
            _check_limits_bounds(value)

    run()
    print(f"\ndecode_limits, mutated valid files: {dict(tried)}")
    assert tried["decoded"] > 0 and tried["refused"] > 0


def _header(size: int, magic: int, version: int, seed: int) -> bytearray:
    # A seeded PRNG fills the bulk: drawing 64 KiB from hypothesis itself is too slow.
    data = bytearray(random.Random(seed).randbytes(size))
    if size >= 12:
        struct.pack_into("<QI", data, 0, magic, version)
    return data


_LAYOUT = (
    (shim_abi.HDR_OFF_REGION_SIZE, shim_abi.REGION_SIZE),
    (shim_abi.HDR_OFF_MAX_DEVICES, shim_abi.MAX_DEVICES),
    (shim_abi.HDR_OFF_MAX_PROCS, shim_abi.MAX_PROCS),
)


def test_region_decoder_on_arbitrary_and_mutated_bytes() -> None:
    tried: Counter[str] = Counter()

    @FUZZ
    @given(
        seed=st.integers(0, 2**64 - 1),
        size=st.sampled_from([shim_abi.REGION_SIZE] * 6 + [0, 7, 255, shim_abi.REGION_SIZE + 1]),
        magic=st.sampled_from([shim_abi.REGION_MAGIC] * 4 + [0, shim_abi.BOARD_MAGIC]),
        version=st.sampled_from([shim_abi.REGION_VERSION] * 4 + [0, 1, 3, 2**32 - 1]),
        device_count=st.integers(0, 2**32 - 1) | st.integers(0, shim_abi.MAX_DEVICES),
        # Mostly the documented layout; sometimes one size field says something else.
        layout=st.lists(
            st.sampled_from([None] * 12 + [0, 1, 8, 2**32 - 1]), min_size=3, max_size=3
        ),
    )
    def run(
        seed: int,
        size: int,
        magic: int,
        version: int,
        device_count: int,
        layout: list[int | None],
    ) -> None:
        data = _header(size, magic, version, seed)
        header_ok = True
        if size >= shim_abi.HDR_OFF_DEVICE_COUNT + 4:
            for (offset, expected), override in zip(_LAYOUT, layout, strict=True):
                field_value = expected if override is None else override
                header_ok = header_ok and field_value == expected
                struct.pack_into("<I", data, offset, field_value)
            struct.pack_into("<I", data, shim_abi.HDR_OFF_DEVICE_COUNT, device_count)
        kind, value = _outcome(shim_abi.decode_region, bytes(data))
        tried[kind] += 1
        valid = (
            (size, magic, version)
            == (shim_abi.REGION_SIZE, shim_abi.REGION_MAGIC, shim_abi.REGION_VERSION)
            and header_ok
            and device_count <= shim_abi.MAX_DEVICES
        )
        assert isinstance(value, shim_abi.Region) == valid, value
        if isinstance(value, shim_abi.Region):
            assert value.device_count == device_count
            assert len(value.devices) == value.device_count
            assert len(value.processes) <= shim_abi.MAX_PROCS
            assert all(len(p.used) == value.device_count for p in value.processes)
            assert all(len(p.host_used) == value.device_count for p in value.processes)
            assert all(len(d.uuid) <= shim_abi.DEV_UUID_SIZE for d in value.devices)

    run()
    print(f"\ndecode_region: {dict(tried)}")
    assert tried["decoded"] > 0 and tried["refused"] > 0


def test_board_decoder_on_arbitrary_and_mutated_bytes() -> None:
    tried: Counter[str] = Counter()

    @FUZZ
    @given(
        seed=st.integers(0, 2**64 - 1),
        size=st.sampled_from([shim_abi.BOARD_SIZE] * 6 + [0, 15, 4095, shim_abi.BOARD_SIZE + 1]),
        magic=st.sampled_from([shim_abi.BOARD_MAGIC] * 4 + [0, shim_abi.REGION_MAGIC]),
        version=st.sampled_from([shim_abi.BOARD_VERSION] * 4 + [0, 1]),
        whole=st.sampled_from([True] * 3 + [False]),
        count=st.sampled_from([0, 1, shim_abi.BOARD_MAX_ENTRIES, shim_abi.BOARD_MAX_ENTRIES + 1]),
    )
    def run(seed: int, size: int, magic: int, version: int, whole: bool, count: int) -> None:
        data = _header(size, magic, version, seed)
        if whole and size == shim_abi.BOARD_SIZE:
            struct.pack_into("<I", data, shim_abi.BOARD_OFF_SIZE, shim_abi.BOARD_SIZE)
            struct.pack_into("<I", data, shim_abi.BOARD_OFF_ENTRY_COUNT, count)
            sequence = data[shim_abi.BOARD_OFF_SEQUENCE : shim_abi.BOARD_OFF_SEQUENCE + 8]
            data[shim_abi.BOARD_OFF_SEQUENCE_END : shim_abi.BOARD_OFF_SEQUENCE_END + 8] = sequence
        kind, value = _outcome(shim_abi.decode_board, bytes(data))
        tried[kind] += 1
        valid = (size, magic, version, whole) == (
            shim_abi.BOARD_SIZE,
            shim_abi.BOARD_MAGIC,
            shim_abi.BOARD_VERSION,
            True,
        ) and count <= shim_abi.BOARD_MAX_ENTRIES
        assert isinstance(value, shim_abi.Board) == valid
        if isinstance(value, shim_abi.Board):
            assert len(value.entries) == count
            assert (
                value.published_ns
                == struct.unpack_from("<Q", data, shim_abi.BOARD_OFF_PUBLISHED_NS)[0]
            )

    run()
    print(f"\ndecode_board: {dict(tried)}")
    assert tried["decoded"] > 0 and tried["refused"] > 0


def test_region_activity_decoder_on_truncated_and_hostile_heads() -> None:
    """What the agent reads of a container's region for the node boards: any head length,
    any header values; it decodes within bounds or refuses with a message."""
    tried: Counter[str] = Counter()

    @FUZZ
    @given(
        seed=st.integers(0, 2**64 - 1),
        size=st.sampled_from(
            [shim_abi.REGION_HEAD_SIZE] * 4
            + [
                shim_abi.REGION_SIZE,
                0,
                100,
                shim_abi.REGION_HEAD_SIZE - 1,
                shim_abi.REGION_SIZE + 1,
            ]
        ),
        magic=st.sampled_from([shim_abi.REGION_MAGIC] * 4 + [0, shim_abi.BOARD_MAGIC]),
        version=st.sampled_from([shim_abi.REGION_VERSION] * 4 + [0, 1]),
        count=st.sampled_from([0, 1, shim_abi.MAX_DEVICES, shim_abi.MAX_DEVICES + 1, 2**32 - 1]),
    )
    def run(seed: int, size: int, magic: int, version: int, count: int) -> None:
        data = _header(size, magic, version, seed)
        if size >= shim_abi.HDR_OFF_DEVICE_COUNT + 4:
            for offset, value in _LAYOUT:
                struct.pack_into("<I", data, offset, value)
            struct.pack_into("<I", data, shim_abi.HDR_OFF_DEVICE_COUNT, count)
        kind, value = _outcome(shim_abi.decode_region_activity, bytes(data))
        tried[kind] += 1
        valid = (
            shim_abi.REGION_HEAD_SIZE <= size <= shim_abi.REGION_SIZE
            and (magic, version) == (shim_abi.REGION_MAGIC, shim_abi.REGION_VERSION)
            and count <= shim_abi.MAX_DEVICES
        )
        assert isinstance(value, shim_abi.RegionActivity) == valid
        if isinstance(value, shim_abi.RegionActivity):
            assert len(value.active_launch_ns) == count
            assert all(0 <= v < 2**64 for v in value.active_launch_ns)

    run()
    print(f"\ndecode_region_activity: {dict(tried)}")
    assert tried["decoded"] > 0 and tried["refused"] > 0
