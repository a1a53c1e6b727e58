"""Host fallback (memory_host_fallback=1): once the GPU itself is full, allocations within
the container's slice are served from host memory, transparently and still counted.

The fake GPU here has 512 MiB and the container's slice is 1 GiB, as on a node whose
memory scaling lets the slices add up to more than the GPU has.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from fracgpu import shim_abi
from tests.shim.sandbox import GiB, MiB, Sandbox, step, steps, wait_for

OOM = "2"
NOT_MANAGED = "1"  # CUDA_ERROR_INVALID_VALUE: cuMemRangeGetAttribute on device memory
CPU = "-1"  # CU_DEVICE_CPU
NONE = "-2"  # CU_DEVICE_INVALID
LOOKUPS = ["direct", "dlsym", "procaddr", "procaddr_ptds"]


@pytest.fixture
def small_gpu(node: Sandbox) -> Sandbox:
    node.device_memory = 512 * MiB
    node.write_fake_config()
    node.write_limits(memory=GiB, memory_host_fallback=True)
    return node


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate("go\n", timeout=30)
    return out


def host_used(node: Sandbox) -> int:
    return node.region().devices[0].memory_host_used


def used(node: Sandbox) -> int:
    return node.region().devices[0].memory_used


def test_off_the_drivers_out_of_memory_reaches_the_program(node: Sandbox) -> None:
    node.device_memory = 512 * MiB
    node.write_fake_config()
    node.write_limits(memory=GiB)  # memory_host_fallback defaults to off
    holder = node.start("mem_ops", "ctx", "0", "alloc", "400Mi", "alloc", "400Mi", "info", "wait")
    try:
        out = "".join(wait_for(holder, "waiting"))
        assert [x[1] for x in steps(out) if x[0] == "alloc"] == ["0", OOM]
        assert step(out, "info")[2:] == [str(112 * MiB), str(512 * MiB)]  # the GPU is smaller
        device = node.region().devices[0]
        assert (device.memory_used, device.memory_host_used, device.host_allocations) == (
            400 * MiB,
            0,
            0,
        )
        assert device.oom_rejections == 0  # the driver refused, not the shim
    finally:
        finish(holder)


@pytest.mark.parametrize("lookup", LOOKUPS)
def test_on_an_allocation_past_the_gpu_is_served_from_host(small_gpu: Sandbox, lookup: str) -> None:
    holder = small_gpu.start(
        "mem_ops",
        "ctx",
        "0",
        "alloc",
        "400Mi",
        "alloc",
        "400Mi",
        "where",
        "0",
        "where",
        "1",
        "info",
        "total",
        "0",
        "wait",
        lookup=lookup,
    )
    try:
        out = "".join(wait_for(holder, "waiting"))
        assert [x[1] for x in steps(out) if x[0] == "alloc"] == ["0", "0"]
        # The first is device memory; the second is managed memory that prefers the host
        # and is mapped for GPU 0.
        assert step(out, "where", 0)[1] == NOT_MANAGED
        assert step(out, "where", 1)[1:] == ["0", CPU, "0", NONE, NONE, NONE]
        # The slice is what the program sees, though the GPU is only half as large.
        assert step(out, "info")[1:] == ["0", str(GiB - 800 * MiB), str(GiB)]
        assert step(out, "total")[1:] == ["0", str(GiB)]
        region = small_gpu.region()
        device = region.devices[0]
        assert (device.memory_used, device.memory_host_used, device.host_allocations) == (
            800 * MiB,
            400 * MiB,
            1,
        )
        assert [(p.used, p.host_used) for p in region.processes] == [((800 * MiB,), (400 * MiB,))]
    finally:
        finish(holder)
    assert (used(small_gpu), host_used(small_gpu)) == (0, 0)  # exit gives both back


def test_freeing_host_backed_memory_uncounts_it(small_gpu: Sandbox) -> None:
    holder = small_gpu.start(
        "mem_ops",
        "ctx",
        "0",
        "alloc",
        "400Mi",  # 0: device
        "alloc",
        "400Mi",  # 1: host
        "free",
        "1",
        "alloc",
        "100Mi",  # 2: device again, the GPU has room for it
        "where",
        "2",
        "free",
        "0",
        "alloc",
        "400Mi",  # 3: device
        "where",
        "3",
        "wait",
    )
    try:
        out = "".join(wait_for(holder, "waiting"))
        assert [x[1] for x in steps(out) if x[0] in ("alloc", "free")] == ["0"] * 6
        assert [x[1] for x in steps(out) if x[0] == "where"] == [NOT_MANAGED, NOT_MANAGED]
        device = small_gpu.region().devices[0]
        assert (device.memory_used, device.memory_host_used, device.host_allocations) == (
            500 * MiB,
            0,
            1,
        )
    finally:
        finish(holder)


def test_no_escape_beyond_the_slice(small_gpu: Sandbox) -> None:
    holder = small_gpu.start("mem_ops", "ctx", "0", "alloc", "400Mi", "wait")
    other: subprocess.Popen[str] | None = None
    try:
        wait_for(holder, "waiting")
        # A second process of the container: the GPU has 112 MiB left, the slice 624 MiB.
        other = small_gpu.start(
            "mem_ops", "ctx", "0", "alloc", "400Mi", "alloc", "300Mi", "fill", "10Mi", "wait"
        )
        out = "".join(wait_for(other, "waiting"))
        assert [x[1] for x in steps(out) if x[0] == "alloc"] == ["0", OOM]
        assert step(out, "fill")[1:] == [OOM, "22"]  # 224 MiB of the slice were left
        region = small_gpu.region()
        device = region.devices[0]
        assert device.memory_used == 1020 * MiB <= GiB
        assert device.oom_rejections == 2  # the 300 MiB, and the fill's last try
        # The holder has only device memory; the other process's 400 MiB and fill went to
        # the host except the 11 chunks of 10 MiB that still fitted on the GPU.
        by_process = sorted((p.used[0], p.host_used[0]) for p in region.processes)
        assert by_process == [(400 * MiB, 0), (620 * MiB, 510 * MiB)]
        assert device.memory_host_used == 510 * MiB
    finally:
        if other is not None:
            finish(other)
        finish(holder)


def _free_order_script(order: list[int]) -> list[str]:
    # 0: 400 MiB device, 1: 300 MiB host, 2: 100 MiB device (fits in the last 112), 3: 200
    # MiB host; then free them in the given order, pausing after each free.
    script = ["ctx", "0", "alloc", "400Mi", "alloc", "300Mi", "alloc", "100Mi", "alloc", "200Mi"]
    script += ["where", "1", "where", "2", "where", "3", "wait"]
    for i in order:
        script += ["free", str(i), "wait"]
    return script


SIZES = {0: (400 * MiB, False), 1: (300 * MiB, True), 2: (100 * MiB, False), 3: (200 * MiB, True)}


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 3, 2], [2, 3, 0, 1]])
def test_device_and_host_frees_in_any_order(small_gpu: Sandbox, order: list[int]) -> None:
    proc = small_gpu.start("mem_ops", *_free_order_script(order))
    assert proc.stdin is not None
    try:
        out = "".join(wait_for(proc, "waiting"))
        assert [x[1] for x in steps(out) if x[0] == "alloc"] == ["0"] * 4
        assert [x[1] for x in steps(out) if x[0] == "where"] == ["0", NOT_MANAGED, "0"]
        live = dict(SIZES)
        assert (used(small_gpu), host_used(small_gpu)) == (1000 * MiB, 500 * MiB)
        for i in order:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            lines = wait_for(proc, "waiting")
            assert lines[0].split() == ["free", "0"]
            del live[i]
            expected_host = sum(size for size, host in live.values() if host)
            expected_used = sum(size for size, _ in live.values())
            assert (used(small_gpu), host_used(small_gpu)) == (expected_used, expected_host)
        assert small_gpu.region().devices[0].host_allocations == 2
    finally:
        finish(proc)


def test_async_allocations_fall_back_and_their_async_free_works(small_gpu: Sandbox) -> None:
    holder = small_gpu.start(
        "mem_ops",
        "ctx",
        "0",
        "async",
        "400Mi",
        "async",
        "400Mi",
        "where",
        "1",
        "freeasync",
        "1",
        "async",
        "50Mi",
        "wait",
    )
    try:
        out = "".join(wait_for(holder, "waiting"))
        assert [x[1] for x in steps(out) if x[0] in ("async", "freeasync")] == ["0"] * 4
        assert step(out, "where")[1:3] == ["0", CPU]
        device = small_gpu.region().devices[0]
        assert (device.memory_used, device.memory_host_used, device.host_allocations) == (
            450 * MiB,
            0,
            1,
        )
    finally:
        finish(holder)


def test_allocations_from_an_explicit_pool_never_fall_back(small_gpu: Sandbox) -> None:
    out = small_gpu.run("mem_ops", "ctx", "0", "pool", "400Mi", "pool", "400Mi")
    assert [x[1] for x in steps(out.stdout) if x[0] == "pool"] == ["0", OOM]


def test_pitched_allocations_fall_back_with_an_aligned_pitch(small_gpu: Sandbox) -> None:
    holder = small_gpu.start(
        "mem_ops", "ctx", "0", "alloc", "400Mi", "pitch", "1000", "200000", "where", "1", "wait"
    )
    try:
        out = "".join(wait_for(holder, "waiting"))
        assert step(out, "pitch")[1] == "0"
        assert step(out, "pitch")[3] == "1024"
        assert step(out, "where")[1:3] == ["0", CPU]
        assert host_used(small_gpu) == 1024 * 200000
        assert used(small_gpu) == 400 * MiB + 1024 * 200000
    finally:
        finish(holder)


def test_managed_memory_the_program_asks_for_is_not_called_host(small_gpu: Sandbox) -> None:
    # Where the program's own managed pages live is up to the driver and its accesses.
    holder = small_gpu.start("mem_ops", "ctx", "0", "managed", "700Mi", "wait")
    try:
        out = "".join(wait_for(holder, "waiting"))
        assert step(out, "managed")[1] == "0"
        assert (used(small_gpu), host_used(small_gpu)) == (700 * MiB, 0)
    finally:
        finish(holder)


def test_advice_refused_means_out_of_memory_not_migration(small_gpu: Sandbox) -> None:
    # Host memory for managed allocations is 400 MiB: the failed fallback must give its
    # managed allocation back, or the program's own 400 MiB managed allocation cannot fit.
    small_gpu.fake_extra = ["cuda_error.cuMemAdvise=801", f"host_memory_bytes={400 * MiB}"]
    small_gpu.write_fake_config()
    holder = small_gpu.start(
        "mem_ops",
        "ctx",
        "0",
        "alloc",
        "400Mi",
        "alloc",
        "400Mi",
        "managed",
        "400Mi",
        "wait",
        extra={"FRACGPU_LOG_LEVEL": "warn"},
    )
    try:
        out = "".join(wait_for(holder, "waiting"))
        assert [x[1] for x in steps(out) if x[0] in ("alloc", "managed")] == ["0", OOM, "0"]
        device = small_gpu.region().devices[0]
        assert (device.memory_used, device.memory_host_used, device.host_allocations) == (
            800 * MiB,
            0,
            0,
        )
    finally:
        _, err = holder.communicate("go\n", timeout=30)
    assert "cannot place" in err


def test_threads_fill_the_slice_exactly_across_device_and_host(small_gpu: Sandbox) -> None:
    holder = small_gpu.start("mem_ops", "ctx", "0", "tfill", "8", "10Mi", "wait")
    try:
        out = "".join(wait_for(holder, "waiting"))
        # 102 chunks of 10 MiB fit the 1 GiB slice: 51 on the 512 MiB GPU, 51 on the host.
        assert step(out, "tfill")[1:] == [str(1020 * MiB), "102"]
        device = small_gpu.region().devices[0]
        assert (device.memory_used, device.memory_host_used, device.host_allocations) == (
            1020 * MiB,
            510 * MiB,
            51,
        )
    finally:
        finish(holder)


def test_threads_churning_host_memory_leave_nothing_counted(small_gpu: Sandbox) -> None:
    # 510 MiB stay on the GPU, so no 10 MiB chunk fits there: 8 threads allocating and
    # freeing 50 times each are all served from the host, and give it all back.
    holder = small_gpu.start(
        "mem_ops", "ctx", "0", "alloc", "510Mi", "threads", "8", "50", "10Mi", "wait"
    )
    try:
        out = "".join(wait_for(holder, "waiting"))
        assert step(out, "threads")[1] == "0"  # no allocation or free failed
        device = small_gpu.region().devices[0]
        assert (device.memory_used, device.memory_host_used) == (510 * MiB, 0)
        assert device.host_allocations == 8 * 50
    finally:
        finish(holder)


def test_a_killed_processs_host_memory_is_reclaimed(small_gpu: Sandbox) -> None:
    victim = small_gpu.start("mem_ops", "ctx", "0", "alloc", "400Mi", "alloc", "400Mi", "wait")
    wait_for(victim, "waiting")
    assert host_used(small_gpu) == 400 * MiB
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=10)
    holder = small_gpu.start("mem_ops", "ctx", "0", "alloc", "400Mi", "alloc", "500Mi", "wait")
    try:
        out = "".join(wait_for(holder, "waiting"))
        assert [x[1] for x in steps(out) if x[0] == "alloc"] == ["0", "0"]
        region = small_gpu.region()
        assert region.reclaimed_procs == 1
        assert (region.devices[0].memory_used, region.devices[0].memory_host_used) == (
            900 * MiB,
            500 * MiB,
        )
    finally:
        finish(holder)


def test_destroying_a_context_releases_its_host_backed_memory(small_gpu: Sandbox) -> None:
    holder = small_gpu.start(
        "mem_ops", "ctx", "0", "ctxcreate", "0", "alloc", "400Mi", "alloc", "400Mi", "info",
        "ctxdestroy", "0", "wait",
    )  # fmt: skip
    try:
        out = "".join(wait_for(holder, "waiting"))
        assert step(out, "ctxdestroy")[1] == "0"
        assert step(out, "info")[2] == str(GiB - 800 * MiB)
        assert (used(small_gpu), host_used(small_gpu)) == (0, 0)
    finally:
        finish(holder)


@pytest.mark.parametrize(("fallback", "total"), [(False, 512 * MiB), (True, GiB)])
def test_nvml_shows_the_slice_even_when_larger_than_the_gpu(
    small_gpu: Sandbox, fallback: bool, total: int
) -> None:
    small_gpu.write_limits(memory=GiB, memory_host_fallback=fallback)
    holder = small_gpu.start("mem_ops", "ctx", "0", "alloc", "300Mi", "wait")
    try:
        wait_for(holder, "waiting")
        out = small_gpu.run("nvml_ops")
        mem = step(out.stdout, "mem")
        assert mem[3:] == ["0", str(total), str(300 * MiB), str(total - 300 * MiB)]
        assert step(out.stdout, "mem2")[3:] == mem[3:]
    finally:
        finish(holder)


def test_limits_file_switches_it_on(small_gpu: Sandbox) -> None:
    text = small_gpu.limits_path.read_bytes()
    assert b"memory_host_fallback=1\n" in text
    assert shim_abi.decode_limits(text).memory_host_fallback
