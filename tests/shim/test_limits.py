"""Limits come from the read-only file; fail closed; the environment only lowers."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fracgpu import shim_abi
from fracgpu.errors import CodecError
from tests.shim.sandbox import BUILD, UUIDS, GiB, MiB, Sandbox, step, steps

NOT_PERMITTED = "800"


def test_missing_limits_file_fails_closed(node: Sandbox) -> None:
    node.limits_path.unlink()
    out = node.run("mem_ops", "ctx", "0", "alloc", "1Mi")
    assert step(out.stdout, "ctx")[1] == NOT_PERMITTED
    assert step(out.stdout, "alloc")[1] == NOT_PERMITTED
    assert str(node.limits_path) in out.stderr
    assert "fail closed" in out.stderr
    assert out.stdout.count("fracgpu") == 0  # messages go to stderr only


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty limits file"),
        ("version=2\ndevice_count=1\n", "unsupported limits version '2'"),
        ("device_count=1\nversion=1\n", "first setting must be version=1"),
        ("version=1\ndevice_count=1\n", "missing device.0.uuid"),
        (f"version=1\ndevice_count=1\ndevice.0.uuid={UUIDS[0]}\n", "memory_limit_bytes"),
        (
            f"version=1\ndevice_count=1\ndevice.0.uuid={UUIDS[0]}\n"
            "device.0.memory_limit_bytes=1Gi\n",
            "line 4: bad device.0.memory_limit_bytes",
        ),
        ("version=1\nmode=whole\nwhole=1\n", "unknown key 'whole'"),
        ("version=1\nmode=whole\nmode=whole\n", "duplicate key 'mode'"),
        ("version=1\nmode=everything\n", "bad mode"),
    ],
)
def test_malformed_limits_fail_closed_with_the_reason(
    node: Sandbox, text: str, message: str
) -> None:
    node.limits_path.write_text(text)
    out = node.run("mem_ops", "ctx", "0", "alloc", "1Mi")
    assert step(out.stdout, "ctx")[1] == NOT_PERMITTED
    assert message in out.stderr


def test_limits_path_that_is_not_a_file_fails_closed(node: Sandbox) -> None:
    node.limits_path.unlink()
    node.limits_path.mkdir()
    out = node.run("mem_ops", "ctx", "0")
    assert step(out.stdout, "ctx")[1] == NOT_PERMITTED
    assert "not a regular file" in out.stderr


def test_read_only_limits_file_is_enough(node: Sandbox) -> None:
    node.limits_path.chmod(0o444)
    out = node.run("mem_ops", "ctx", "0", "alloc", "1Gi", "alloc", "1")
    assert [x[1] for x in steps(out.stdout) if x[0] == "alloc"] == ["0", "2"]


def test_whole_gpu_opt_out_comes_only_from_the_file(node: Sandbox) -> None:
    node.limits_path.write_bytes(shim_abi.encode_limits(shim_abi.Limits(whole=True)))
    out = node.run("mem_ops", "ctx", "0", "alloc", "3Gi", "info")
    assert step(out.stdout, "alloc")[1] == "0"
    assert step(out.stdout, "info")[3] == str(4 * GiB)
    assert not node.region_path.exists()  # nothing to account


def test_environment_cannot_raise_the_memory_limit(node: Sandbox) -> None:
    out = node.run(
        "mem_ops",
        "ctx",
        "0",
        "info",
        extra={"FRACGPU_MEMORY_LIMIT": "3Gi", "FRACGPU_LOG_LEVEL": "warn"},
    )
    assert step(out.stdout, "info")[3] == str(GiB)
    assert "cannot raise" in out.stderr


def test_environment_can_lower_the_memory_limit(node: Sandbox) -> None:
    out = node.run(
        "mem_ops", "ctx", "0", "info", "alloc", "300Mi", extra={"FRACGPU_MEMORY_LIMIT": "256Mi"}
    )
    assert step(out.stdout, "info")[3] == str(256 * MiB)
    assert step(out.stdout, "alloc")[1] == "2"


def test_malformed_environment_value_is_reported_and_ignored(node: Sandbox) -> None:
    out = node.run("mem_ops", "ctx", "0", "info", extra={"FRACGPU_MEMORY_LIMIT": "lots"})
    assert step(out.stdout, "info")[3] == str(GiB)
    assert "ignoring FRACGPU_MEMORY_LIMIT=lots" in out.stderr


def test_silent_by_default_verbose_on_request(node: Sandbox) -> None:
    quiet = node.run("mem_ops", "ctx", "0", "alloc", "2Gi")
    assert quiet.stderr == ""
    loud = node.run("mem_ops", "ctx", "0", "alloc", "2Gi", extra={"FRACGPU_LOG_LEVEL": "debug"})
    assert "limits loaded" in loud.stderr
    assert "refused" in loud.stderr
    assert loud.stdout == quiet.stdout


def test_region_directory_missing_fails_closed(node: Sandbox) -> None:
    out = node.run("mem_ops", "ctx", "0", region=node.root / "absent" / "region")
    assert step(out.stdout, "ctx")[1] == NOT_PERMITTED
    assert "cannot create region" in out.stderr


def test_region_that_cannot_be_written_fails_closed(node: Sandbox) -> None:
    (node.root / "dir-region").mkdir()
    out = node.run("mem_ops", "ctx", "0", region=node.root / "dir-region")
    assert step(out.stdout, "ctx")[1] == NOT_PERMITTED
    assert "read-write" in out.stderr


def test_region_of_another_version_is_refused_loudly(node: Sandbox) -> None:
    node.run("mem_ops", "ctx", "0")
    data = bytearray(node.region_path.read_bytes())
    struct.pack_into("<I", data, shim_abi.HDR_OFF_VERSION, 1)
    node.region_path.write_bytes(bytes(data))
    out = node.run("mem_ops", "ctx", "0")
    assert step(out.stdout, "ctx")[1] == NOT_PERMITTED
    assert "version 1" in out.stderr and "refusing" in out.stderr


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [
        (shim_abi.HDR_OFF_REGION_SIZE, 65536, "header region_size 65536, this shim needs 131072"),
        (shim_abi.HDR_OFF_MAX_DEVICES, 8, "header max_devices 8, this shim needs 16"),
        (shim_abi.HDR_OFF_MAX_PROCS, 128, "header max_procs 128, this shim needs 256"),
        (shim_abi.HDR_OFF_DEVICE_COUNT, 17, "header device_count 17, at most 16 is allowed"),
    ],
)
def test_region_header_that_lies_about_its_layout_is_refused(
    node: Sandbox, offset: int, value: int, message: str
) -> None:
    node.run("mem_ops", "ctx", "0")
    data = bytearray(node.region_path.read_bytes())
    struct.pack_into("<I", data, offset, value)
    node.region_path.write_bytes(bytes(data))
    out = node.run("mem_ops", "ctx", "0")
    assert step(out.stdout, "ctx")[1] == NOT_PERMITTED
    assert message in out.stderr


def test_region_of_the_wrong_size_is_refused(node: Sandbox) -> None:
    node.region_path.write_bytes(b"\0" * 100)
    out = node.run("mem_ops", "ctx", "0")
    assert step(out.stdout, "ctx")[1] == NOT_PERMITTED
    assert "wrong size" in out.stderr


def test_production_build_ignores_test_path_variables(node: Sandbox) -> None:
    assert b"FRACGPU_TEST_LIMITS_PATH" not in (BUILD / "libfracgpu.so").read_bytes()
    assert b"FRACGPU_TEST_LIMITS_PATH" in (BUILD / "libfracgpu-test.so").read_bytes()
    if Path(shim_abi.LIMITS_PATH).exists():
        pytest.skip("this machine has a real limits file")
    out = node.run("mem_ops", "ctx", "0", preload="libfracgpu.so")
    assert step(out.stdout, "ctx")[1] == NOT_PERMITTED
    assert shim_abi.LIMITS_PATH in out.stderr


# ---- the C parser and fracgpu.shim_abi agree ----


def c_parse(path: Path, env: dict[str, str] | None = None) -> tuple[bool, str]:
    out = subprocess.run(
        [str(BUILD / "tests" / "limits_check"), str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
        timeout=10,
    )
    return out.returncode == 0, out.stdout


def expected_c_output(limits: shim_abi.Limits) -> str:
    lines = [
        f"mode {'whole' if limits.whole else 'sliced'}",
        f"namespace {limits.namespace or ''}",
        f"pod {limits.pod or ''}",
        f"container {limits.container or ''}",
        f"pod_uid {limits.pod_uid or ''}",
        f"device_count {len(limits.devices)}",
        f"compute_limit_enabled {int(limits.compute_limit_enabled)}",
        f"burst_when_alone {int(limits.burst_when_alone)}",
        f"priority {limits.priority}",
        f"context_overhead_bytes {limits.context_overhead_bytes}",
        f"memory_host_fallback {int(limits.memory_host_fallback)}",
    ]
    for i, d in enumerate(limits.devices):
        lines.append(
            f"device {i} {d.uuid} {d.memory_limit_bytes} {d.core_limit} "
            f"{d.effective_core_limit_max}"
        )
    return "\n".join(lines) + "\n"


def test_c_parser_reads_what_python_writes(tmp_path: Path, shim_build: Path) -> None:
    limits = shim_abi.Limits(
        devices=(
            shim_abi.DeviceLimits(UUIDS[0], 3 * GiB, 30, 50),
            shim_abi.DeviceLimits(UUIDS[1], 5 * GiB),
        ),
        namespace="team",
        pod="p-0",
        container="c",
        pod_uid="uid-1",
        priority=0,
        compute_limit_enabled=False,
        burst_when_alone=True,
        context_overhead_bytes=123,
        memory_host_fallback=True,
    )
    path = tmp_path / "limits"
    path.write_bytes(shim_abi.encode_limits(limits))
    ok, text = c_parse(path)
    assert ok, text
    assert text == expected_c_output(limits)


def test_c_parser_applies_environment_only_downwards(tmp_path: Path, shim_build: Path) -> None:
    path = tmp_path / "limits"
    path.write_bytes(
        shim_abi.encode_limits(shim_abi.Limits(devices=(shim_abi.DeviceLimits("G", GiB, 40),)))
    )
    _, raised = c_parse(path, {"FRACGPU_MEMORY_LIMIT": "2Gi", "FRACGPU_CORE_LIMIT": "90"})
    assert f"device 0 G {GiB} 40 40" in raised
    _, lowered = c_parse(path, {"FRACGPU_MEMORY_LIMIT": "1Mi", "FRACGPU_CORE_LIMIT": "10"})
    assert f"device 0 G {MiB} 10 40" in lowered


VALID = (
    f"version=1\nmode=sliced\npod=p\ndevice_count=2\ndevice.0.uuid={UUIDS[0]}\n"
    f"device.0.memory_limit_bytes=1073741824\ndevice.0.core_limit=30\n"
    f"device.1.uuid={UUIDS[1]}\ndevice.1.memory_limit_bytes=2048\npriority=0\n"
    "memory_host_fallback=1\n"
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    edits=st.lists(
        st.tuples(
            st.integers(0, len(VALID)),
            st.integers(0, 4),
            st.text(alphabet="=.\n #0129abdevicemoryt_-\t\rhsfl", max_size=6),
        ),
        max_size=4,
    )
)
def test_c_and_python_parsers_agree_on_mutated_files(
    tmp_path: Path, shim_build: Path, edits: list[tuple[int, int, str]]
) -> None:
    text = VALID
    for at, cut, insert in edits:
        pos = min(at, len(text))
        text = text[:pos] + insert + text[pos + cut :]
    path = tmp_path / "fuzzed"
    path.write_text(text)
    ok, c_out = c_parse(path)
    try:
        limits = shim_abi.decode_limits(text.encode())
    except CodecError:
        assert not ok, f"C accepted what Python refused:\n{text!r}\n{c_out}"
    else:
        assert ok, f"C refused what Python accepted:\n{text!r}\n{c_out}"
        assert c_out == expected_c_output(limits)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=2000))
def test_c_parser_survives_arbitrary_bytes(tmp_path: Path, shim_build: Path, data: bytes) -> None:
    path = tmp_path / "garbage"
    path.write_bytes(b"version=1\n" + data)
    out = subprocess.run(
        [str(BUILD / "tests" / "limits_check"), str(path)],
        capture_output=True,
        check=False,
        timeout=10,
    )
    assert out.returncode in (0, 1), out
    if out.returncode == 1:
        assert out.stdout.startswith(b"error malformed limits file")


def test_nvml_fails_closed_too(node: Sandbox) -> None:
    node.limits_path.unlink()
    out = node.run("nvml_ops")
    assert step(out.stdout, "init")[1] == "4"  # NVML_ERROR_NO_PERMISSION
    assert "fail closed" in out.stderr


def test_nvml_in_whole_mode_shows_the_device(node: Sandbox) -> None:
    node.limits_path.write_bytes(shim_abi.encode_limits(shim_abi.Limits(whole=True)))
    out = node.run("nvml_ops")
    assert step(out.stdout, "mem")[4] == str(4 * GiB)


def test_lowering_by_environment_stays_in_that_process(node: Sandbox) -> None:
    low = node.run("mem_ops", "ctx", "0", "alloc", "300Mi", extra={"FRACGPU_MEMORY_LIMIT": "256Mi"})
    assert step(low.stdout, "alloc")[1] == "2"
    assert node.region().devices[0].memory_limit == GiB  # the container's limit is unchanged
    other = node.run("mem_ops", "ctx", "0", "alloc", "900Mi")
    assert step(other.stdout, "alloc")[1] == "0"
