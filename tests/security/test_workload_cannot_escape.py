"""The workload against its slice: what a process inside a fracgpu container can change
(its environment, LD_PRELOAD) does not lift its limits, and a GPU not in its limits file
offers it nothing. Real processes under the shim on the libcuda/NVML test doubles."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.shim_install import install_shim
from fracgpu import names, shim_abi
from tests.shim.sandbox import (
    BUILD,
    UUIDS,
    GiB,
    MiB,
    Sandbox,
    build_shim,
    can_make_mount_namespaces,
    step,
    steps,
)

OOM = "2"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Sandbox]:
    build_shim()
    box = Sandbox(root=tmp_path)
    box.write_fake_config()
    box.write_limits()
    yield box


def _busy_share(out: subprocess.CompletedProcess[str]) -> float:
    assert out.returncode == 0, out.stdout + out.stderr
    return float(step(out.stdout, "launch")[3])


def test_environment_cannot_raise_the_compute_limit(node: Sandbox) -> None:
    node.write_limits(core=30)
    args = ("launch_ops", "2000", "1.5", "launch")
    raised = _busy_share(node.run(*args, extra={names.ENV_SHIM_CORE_LIMIT: "100"}))
    assert raised <= 0.40, raised  # still paced to its 30 %
    lowered = _busy_share(node.run(*args, extra={names.ENV_SHIM_CORE_LIMIT: "10"}))
    assert lowered <= 0.20, lowered  # lowering works, so the variable is read
    node.write_limits(core=100)
    assert _busy_share(node.run(*args)) >= 0.9  # what unpaced looks like here


def test_environment_cannot_raise_the_memory_limit_in_any_form(node: Sandbox) -> None:
    for value in ("2Gi", "2147483648", "18446744073709551615", "1Ti"):
        out = node.run(
            "mem_ops", "ctx", "0", "alloc", "900Mi", "alloc", "200Mi", "info",
            extra={names.ENV_SHIM_MEMORY_LIMIT: value},
        )  # fmt: skip
        assert [s[1] for s in steps(out.stdout) if s[0] == "alloc"] == ["0", OOM], value
        assert step(out.stdout, "info")[3] == str(GiB), value


def test_a_gpu_not_given_shows_no_memory_through_nvml(node: Sandbox) -> None:
    node.device_count = 2
    node.write_fake_config()
    # The container was given GPU 1 only.
    limits = shim_abi.Limits(
        devices=(shim_abi.DeviceLimits(UUIDS[1], GiB, 50),),
        namespace="ns",
        pod="pod",
        container="main",
    )
    node.limits_path.write_bytes(shim_abi.encode_limits(limits))
    out = node.run("nvml_ops")
    seen = {s[2]: s[3:] for s in steps(out.stdout) if s[0] == "mem"}
    # The shim does not hide a GPU from enumeration (NVIDIA_VISIBLE_DEVICES does that):
    # it shows one it was not given as having no memory at all.
    assert seen == {UUIDS[0]: ["0", "0", "0", "0"], UUIDS[1]: ["0", str(GiB), "0", str(GiB)]}
    without = node.run("nvml_ops", preload=None)
    assert step(without.stdout, "mem")[4] == str(4 * GiB)  # the double's real size


def _namespace_script(root: Path, library: Path, preload: Path, preload_mounted: bool) -> str:
    """Shell run in a private mount namespace: the container's view of its files, as the
    device plugin mounts them (production paths), then a CUDA program without LD_PRELOAD."""
    etc = root / "etc"
    lines = [
        "set -e",
        f"mount --bind {etc} /etc",  # a copy of /etc: nothing outside this namespace changes
        "mount -t tmpfs tmpfs /usr/local",
        "mkdir -p /usr/local/fracgpu/lib",
        f"cp {library} {names.CONTAINER_LIBRARY_PATH}",
        "mount -t tmpfs tmpfs /run",
        f"mkdir -p -m 777 {names.CONTAINER_REGION_DIR}",
    ]
    if preload_mounted:
        lines += [
            f"touch {names.CONTAINER_PRELOAD_PATH}",
            f"mount --bind {preload} {names.CONTAINER_PRELOAD_PATH}",
            f"mount -o remount,bind,ro {names.CONTAINER_PRELOAD_PATH}",
        ]
    program = BUILD / "tests" / "mem_ops"
    lines.append(f"exec env -u LD_PRELOAD {program} ctx 0 alloc 900Mi alloc 200Mi info")
    return "\n".join(lines)


def test_unsetting_ld_preload_does_not_escape_the_shim(node: Sandbox, tmp_path: Path) -> None:
    if not can_make_mount_namespaces():
        pytest.skip("needs a private mount namespace (unshare --mount as root)")
    # The files the agent installs and writes, in a container's mount namespace.
    installed = install_shim(BUILD / "libfracgpu.so", tmp_path / "host-lib")
    etc = tmp_path / "ns" / "etc"
    shutil.copytree("/etc", etc, symlinks=True)
    (etc / "fracgpu").mkdir()
    shutil.copy(node.limits_path, etc / "fracgpu" / "limits")  # a 1 GiB slice
    env = node.env(preload=None)
    for key in ("FRACGPU_TEST_LIMITS_PATH", "FRACGPU_TEST_REGION_PATH", "FRACGPU_TEST_NODE_DIR"):
        env.pop(key)  # production build: only the mounted paths count

    def run(preload_mounted: bool) -> subprocess.CompletedProcess[str]:
        script = _namespace_script(
            tmp_path / "ns", installed.library, installed.preload, preload_mounted
        )
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    limited = run(preload_mounted=True)
    assert limited.returncode == 0, limited.stderr
    assert [s[1] for s in steps(limited.stdout) if s[0] == "alloc"] == ["0", OOM]
    assert step(limited.stdout, "info")[3] == str(GiB)
    # Without /etc/ld.so.preload nothing loads the shim: the same program is unlimited.
    free = run(preload_mounted=False)
    assert free.returncode == 0, free.stderr
    assert [s[1] for s in steps(free.stdout) if s[0] == "alloc"] == ["0", "0"]
    assert int(step(free.stdout, "info")[3]) == node.device_memory
    assert node.device_memory > GiB + 200 * MiB


# ---- the dynamic loader's other doors (shim/src/dl_hooks.c, shim/tests/escape.c) ----

DOORS_AROUND_THE_LINKER = [
    "deepbind",  # a library opened RTLD_DEEPBIND binds cuMemAlloc_v2 to libcuda itself
    "deepbind_dlsym",  # ... and its own dlsym reference to glibc's
    "dlmopen_new",  # a private namespace gets its own libcuda and no shim
    "dlmopen_libc",  # glibc's dlmopen found with dlsym on libc's handle
    "dlmopen_dlvsym",  # ... or with dlvsym and glibc's version name
]


def _escape(node: Sandbox, way: str, *args: str) -> subprocess.CompletedProcess[str]:
    out = node.run("escape", way, *args)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


@pytest.mark.parametrize("way", DOORS_AROUND_THE_LINKER)
def test_no_loader_door_reaches_the_driver_past_the_slice(node: Sandbox, way: str) -> None:
    out = _escape(node, way)
    if step(out.stdout, "open")[1] == "refused":
        # dlmopen: refused, and dlerror() says why
        assert "dlmopen into a namespace other than LM_ID_BASE is refused" in out.stdout
        assert way.startswith("dlmopen_")
        return
    assert step(out.stdout, "ctx")[1] == "0"
    # 900 MiB fits the 1 GiB slice, 200 MiB more does not
    assert [s[1] for s in steps(out.stdout) if s[0] == "alloc"] == ["0", OOM], out.stdout
    # the same door without the shim really does reach the whole device
    free = node.run("escape", way, preload=None)
    assert [s[1] for s in steps(free.stdout) if s[0] == "alloc"] == ["0", "0"], free.stdout


@pytest.mark.parametrize(
    "way", ["path:libcuda.so.1", "path:libcuda.so", "noload", "origin", "dlmopen_base"]
)
def test_the_driver_by_any_name_or_flag_is_the_shims(node: Sandbox, way: str) -> None:
    # By full path, through the libcuda.so symlink, with RTLD_NOLOAD, from a library
    # found through the program's RUNPATH (dlopen keeps the caller's search path), and
    # dlmopen into the base namespace: all held to the slice.
    name, _, lib = way.partition(":")
    out = _escape(node, name, *([str(BUILD / "doubles" / lib)] if lib else []))
    assert step(out.stdout, "open")[1] == "ok", out.stdout
    assert [s[1] for s in steps(out.stdout) if s[0] == "alloc"] == ["0", OOM], out.stdout


def test_a_whole_gpu_container_keeps_deepbind_and_dlmopen(node: Sandbox) -> None:
    node.limits_path.write_bytes(shim_abi.encode_limits(shim_abi.Limits(devices=(), whole=True)))
    for way in ("deepbind", "dlmopen_new"):
        out = _escape(node, way)
        assert [s[1] for s in steps(out.stdout) if s[0] == "alloc"] == ["0", "0"], out.stdout


def test_an_audit_library_fails_closed(node: Sandbox) -> None:
    # An rtld-audit library (LD_AUDIT) can rebind any symbol and load the driver in a
    # namespace of its own: the container's CUDA calls fail instead of going unsliced.
    audit = str(BUILD / "tests" / "libaudit_mod.so")
    out = node.run("mem_ops", "ctx", "0", "alloc", "200Mi", extra={"LD_AUDIT": audit})
    assert step(out.stdout, "ctx")[1] == "800", out.stdout
    assert "LD_AUDIT" in out.stderr
    plain = node.run("mem_ops", "ctx", "0", "alloc", "200Mi")
    assert step(plain.stdout, "alloc")[1] == "0"
