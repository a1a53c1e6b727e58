"""Interception: exports, dlsym, cuGetProcAddress (versions, ptds) and RTLD_NEXT."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.shim.sandbox import BUILD, SHIM_DIR, Sandbox

HOOKS = re.findall(r"^(?:CU|NVML)HOOK\((\w+),", (SHIM_DIR / "src" / "hooks.def").read_text(), re.M)
CUDA_HOOKS = re.findall(r"^CUHOOK\((\w+),", (SHIM_DIR / "src" / "hooks.def").read_text(), re.M)


def exported(lib: str) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(BUILD / lib)],
        capture_output=True,
        text=True,
        check=True,
    )
    return {line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.strip()}


def test_only_the_hooks_are_exported(shim_build: object) -> None:
    assert len(HOOKS) > 40
    for lib in ("libfracgpu.so", "libfracgpu-test.so"):
        assert exported(lib) == {*HOOKS, "dlsym", "dlopen", "dlmopen", "dlvsym"}


def lookup_lines(node: Sandbox, preload: str | None) -> dict[tuple[str, str], list[str]]:
    out = node.run("lookup", preload=preload)
    assert out.returncode == 0, out.stderr
    return {(x[0], x[1]): x[2:] for x in (line.split() for line in out.stdout.splitlines())}


def test_every_way_of_finding_a_hook_lands_in_the_shim(node: Sandbox) -> None:
    lines = lookup_lines(node, "libfracgpu-test.so")
    for name in CUDA_HOOKS:
        for way in ("linker", "dlsym", "default", "procaddr_v2", "procaddr"):
            got = lines[(name, way)]
            assert got[0] == "libfracgpu-test.so", (name, way, got)
        assert lines[(name, "procaddr_v2")][1:] == ["0", "0"]


def test_without_the_shim_the_driver_answers(node: Sandbox) -> None:
    lines = lookup_lines(node, None)
    assert lines[("cuMemAlloc_v2", "procaddr_v2")][0] == "libcuda.so.1"
    assert lines[("cuLaunchKernel_ptsz", "dlsym")][0] == "libcuda.so.1"


def test_unknown_and_too_new_symbols_keep_the_drivers_answer(node: Sandbox) -> None:
    lines = lookup_lines(node, "libfracgpu-test.so")
    assert lines[("missing", "500")] == ["1", "null"]
    assert lines[("too_old", "500")] == ["2"]


def test_rtld_next_is_relative_to_the_caller(node: Sandbox) -> None:
    # libprobe_a asks dlsym(RTLD_NEXT, "fracgpu_probe"): the answer must be
    # libprobe_b's, not its own (which a naive dlsym hook would return).
    lines = lookup_lines(node, "libfracgpu-test.so")
    assert lines[("rtld_next", "b")] == []


def test_works_next_to_an_interposer_that_calls_dlsym_while_starting(node: Sandbox) -> None:
    # AddressSanitizer's runtime resolves its interceptors with dlsym(RTLD_NEXT, ...)
    # during its own initialisation, before malloc works: our dlsym must not call
    # anything on that path.
    asan = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if not asan.startswith("/"):
        pytest.skip("no libasan in this toolchain")
    preload = f"{asan}:{BUILD / 'libfracgpu-test.so'}"
    env = node.env(extra={"LD_PRELOAD": preload, "ASAN_OPTIONS": "detect_leaks=0"})
    shell = subprocess.run(["/bin/sh", "-c", "true"], env=env, check=False, timeout=30)
    assert shell.returncode == 0
    out = subprocess.run(
        [str(BUILD / "tests" / "mem_ops"), "ctx", "0", "alloc", "2Gi", "alloc", "512Mi"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert [line.split()[1] for line in out.stdout.splitlines()] == ["0", "2", "0"], out.stderr
