"""The shim with the real driver and PyTorch. Skipped without an NVIDIA GPU.

Run on a GPU host: ``.venv/bin/pytest -m gpu tests/gpu -v``. It builds the shim, writes
per-test limits files for the first GPU and runs PyTorch in subprocesses with the test
build preloaded (per-test paths), as a container would with the production build.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.boardfiles import BoardFiles
from agent.boards import BoardLoop, BoardPublisher, at
from agent.context_probe import measure_gpu
from agent.limits import MAX_CONTEXT_OVERHEAD_BYTES
from agent.nvml_backend import PynvmlBackend
from fracgpu import shim_abi

from .container import Container, GiB, Gpu, MiB, finished_json

TOLERANCE = 0.05  # of the unsliced throughput
DUTY_TOLERANCE = 0.02  # of wall time; measured within 0.002 on an H200

pytestmark = pytest.mark.gpu


def test_mem_get_info_shows_the_slice(box: Container) -> None:
    got = box.result(
        """
        import json, torch
        free, total = torch.cuda.mem_get_info()
        print(json.dumps({"free": free, "total": total}))
        """
    )
    assert got["total"] == 2 * GiB
    assert isinstance(got["free"], int) and got["free"] <= 2 * GiB


ALLOC = """
import json, sys, torch
torch.cuda.init()
held = []
results = []
for mib in map(int, sys.argv[1:] or {sizes}):
    try:
        held.append(torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda"))
        results.append("ok")
    except torch.cuda.OutOfMemoryError:
        results.append("oom")
print(json.dumps({{"results": results}}), flush=True)
if {hold}:
    sys.stdin.readline()
"""


def test_allocations_within_the_slice_succeed_past_it_fail(box: Container) -> None:
    got = box.result(ALLOC.format(sizes=[1024, 512, 1024], hold=False))
    assert got["results"] == ["ok", "ok", "oom"]


def test_nvidia_smi_shows_the_slice(box: Container) -> None:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        env=box.env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout.split()[0]) == 2048


def test_two_processes_share_one_slice(box: Container) -> None:
    holder = box.python(ALLOC.format(sizes=[1200], hold=True))
    try:
        assert holder.stdout is not None
        assert json.loads(holder.stdout.readline())["results"] == ["ok"]
        other = box.result(ALLOC.format(sizes=[1200, 300], hold=False))
        assert other["results"] == ["oom", "ok"]
    finally:
        holder.communicate("go\n", timeout=60)


# A matmul loop: its rate, the share of wall time its kernels were charged for (the duty
# cycle the shim paces; the region's kernel time, when the shim runs) and the SM clock.
MATMUL = """
import json, os, struct, time, torch
region = os.environ.get("FRACGPU_TEST_REGION_PATH")
def kernel_ns():
    if not region or not os.path.exists(region):
        return 0
    with open(region, "rb") as f:
        return struct.unpack_from("<Q", f.read(), {kernel_off})[0]
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for _ in range(20):
    a @ b
torch.cuda.synchronize()
print("warm", flush=True)
k0 = kernel_ns()
start = time.monotonic()
n = 0
while time.monotonic() - start < {seconds}:
    for _ in range(10):
        a @ b
    n += 10
torch.cuda.synchronize()
wall = time.monotonic() - start
try:
    clock = torch.cuda.clock_rate()
except Exception:
    clock = 0
print(json.dumps({{"rate": n / wall, "duty": (kernel_ns() - k0) / 1e9 / wall, "clock": clock}}))
"""
KERNEL_TIME_OFF = shim_abi.DEVICES_OFF + shim_abi.DEV_OFF_KERNEL_TIME_NS


@dataclass(frozen=True)
class Loop:
    rate: float  # matmuls per second
    duty: float  # charged kernel time per second of wall time (0 without the shim)
    clock: int  # SM clock at the end, MHz


def matmul_loop(container: Container, seconds: float = 8, preload: bool = True) -> Loop:
    return loop_result(container.python(loop_program(seconds), preload))


def loop_program(seconds: float) -> str:
    return MATMUL.format(seconds=seconds, kernel_off=KERNEL_TIME_OFF)


def loop_result(proc: subprocess.Popen[str]) -> Loop:
    got = finished_json(proc)
    rate, duty, clock = got["rate"], got["duty"], got["clock"]
    assert isinstance(rate, float) and isinstance(duty, float) and isinstance(clock, int), got
    return Loop(rate, duty, clock)


@pytest.fixture(scope="module")
def unsliced(gpu: Gpu, tmp_path_factory: pytest.TempPathFactory) -> Loop:
    """The matmul loop on the whole GPU without the shim."""
    return matmul_loop(Container(tmp_path_factory.mktemp("unsliced"), gpu), preload=False)


@pytest.mark.parametrize("core", [10, 30, 50, 70])
def test_a_slice_runs_at_its_share(box: Container, unsliced: Loop, core: int) -> None:
    box.limit(4 * GiB, core=core)
    sliced = matmul_loop(box)
    share = sliced.rate / unsliced.rate
    print(
        f"{core} % slice: matmul/s {sliced.rate:.1f} of {unsliced.rate:.1f} ({share:.3f}),"
        f" duty {sliced.duty:.3f}, SM clock {sliced.clock} MHz (unsliced {unsliced.clock})"
    )
    # The shim paces GPU time: the duty cycle is the slice. Throughput may exceed it: a GPU
    # running part time keeps higher clocks than one running flat out (on an H200, 1,830-1,980
    # MHz sliced against 1,425 MHz unsliced gave 11.2 % of the matmuls at 10 %, 77.1 % at 70 %).
    assert abs(sliced.duty - core / 100) <= DUTY_TOLERANCE, (sliced, unsliced)
    assert share >= core / 100 - TOLERANCE, (sliced, unsliced)


@pytest.mark.parametrize("small", [25, 10])
def test_two_containers_split_by_their_shares(tmp_path: Path, gpu: Gpu, small: int) -> None:
    low, high = Container(tmp_path / "small", gpu), Container(tmp_path / "big", gpu)
    low.limit(4 * GiB, core=small)
    high.limit(4 * GiB, core=100 - small)
    procs = [c.python(loop_program(10)) for c in (low, high)]
    loops = [loop_result(p) for p in procs]
    share = loops[0].rate / (loops[0].rate + loops[1].rate)
    print(
        f"{small} / {100 - small}: matmul/s {loops[0].rate:.1f} / {loops[1].rate:.1f}"
        f" (share {share:.3f}), duty {loops[0].duty:.3f} / {loops[1].duty:.3f}"
    )
    for loop, core in zip(loops, (small, 100 - small), strict=True):
        assert abs(loop.duty - core / 100) <= DUTY_TOLERANCE, loops
    assert abs(share - small / 100) <= TOLERANCE, loops


def test_high_priority_keeps_its_throughput_next_to_low_priority(tmp_path: Path, gpu: Gpu) -> None:
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    high = Container(tmp_path / "high", gpu, node_dir)
    low = Container(tmp_path / "low", gpu, node_dir)
    high.limit(4 * GiB, priority=0)
    low.limit(4 * GiB, priority=1)
    # The agent's board publisher, over these two containers' files.
    boards = BoardLoop(
        BoardPublisher(
            BoardFiles(node_dir),
            lambda: [gpu.uuid],
            lambda: [(c.root / "limits", at(c.root / "region")) for c in (high, low)],
        ),
        0.01,
    )
    boards.start()
    try:
        alone = matmul_loop(high).rate
        # The low one's 20 s loop is running before the high one starts its 10 s (about
        # 4-14 s into it), so the two overlap for the high one's whole loop.
        background = low.python(loop_program(20))
        assert background.stdout is not None
        assert background.stdout.readline().strip() == "warm"
        beside = matmul_loop(high, seconds=10).rate
        behind = loop_result(background).rate
    finally:
        boards.stop()
    print(f"matmul/s: high alone {alone:.1f}, high {beside:.1f} beside low; low {behind:.1f}")
    assert beside >= 0.9 * alone, (alone, beside, behind)
    # the low one gave up the GPU for about half of its loop
    assert behind <= 0.75 * alone, (alone, beside, behind)


# Small kernels back to back: the launch rate is bound by the host-side cost of each
# cuLaunchKernel, which is where the shim adds its own.
LAUNCHES = """
import json, time, torch
x = torch.zeros(256, device="cuda")
for _ in range(1000):
    x.add_(1)
torch.cuda.synchronize()
start = time.monotonic()
n = 0
while time.monotonic() - start < 3:
    for _ in range(1000):
        x.add_(1)
    n += 1000
torch.cuda.synchronize()
print(json.dumps({"rate": n / (time.monotonic() - start)}))
"""


def test_a_whole_gpu_slice_adds_little_to_each_launch(box: Container) -> None:
    box.limit(4 * GiB, core=100)
    rates: dict[bool, float] = {}
    for preload in (False, True, False, True):  # alternated: the machine's speed drifts
        got = box.result(LAUNCHES, preload=preload)["rate"]
        assert isinstance(got, float)
        rates[preload] = max(rates.get(preload, 0.0), got)
    print(f"launches/s: no shim {rates[False]:.0f}, shim {rates[True]:.0f}")
    assert rates[True] >= 0.9 * rates[False], rates


# Host fallback: a slice 2 GiB larger than the GPU. The program fills it to 512 MiB short
# of the slice in 256 MiB tensors (the last ones past the GPU's memory come from the
# host), computes on all of them, then asks for 1 GiB more. It reads the region's
# host-backed bytes itself while it still holds everything.
OVERSUBSCRIBE = """
import json, struct, torch
free, total = torch.cuda.mem_get_info()
chunk = 256 << 20
held, filled = [], 0
try:
    while filled + chunk <= total - (512 << 20):
        held.append(torch.ones(chunk // 4, device="cuda"))
        filled += chunk
except torch.cuda.OutOfMemoryError:
    pass
sum_ok = sum(int(t.sum().item()) for t in held) == filled // 4
try:
    torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    beyond = "allocated"
except torch.cuda.OutOfMemoryError:
    beyond = "oom"
region = open({region!r}, "rb").read()
host = struct.unpack_from("<Q", region, {host_off})[0]
print(json.dumps({{"total": total, "filled": filled, "sum_ok": sum_ok, "beyond": beyond,
                  "host": host}}))
"""


@pytest.mark.parametrize("fallback", [True, False])
def test_host_fallback_oversubscribes_the_gpu(box: Container, fallback: bool) -> None:
    slice_bytes = box.gpu.total_mib * MiB + 2 * GiB
    box.limit(slice_bytes, host_fallback=fallback)
    got = box.result(
        OVERSUBSCRIBE.format(
            region=str(box.root / "region"),
            host_off=shim_abi.DEVICES_OFF + shim_abi.DEV_OFF_MEMORY_HOST_USED,
        ),
        timeout=600,
    )
    assert got["sum_ok"] is True
    assert got["beyond"] == "oom"  # never past the slice
    filled, host = got["filled"], got["host"]
    assert isinstance(filled, int) and isinstance(host, int)
    if fallback:
        assert got["total"] == slice_bytes  # the slice, though larger than the GPU
        assert filled == (slice_bytes - 512 * MiB) // (256 * MiB) * (256 * MiB)
        assert host >= 2 * GiB - 512 * MiB - 256 * MiB  # at least what the GPU cannot hold
    else:
        physical = box.gpu.total_mib * MiB  # nvidia-smi's MiB; the driver counts bytes
        assert isinstance(got["total"], int) and abs(got["total"] - physical) <= physical // 100
        assert filled < box.gpu.total_mib * MiB and host == 0


# The driver API through ctypes, the primary context of device 0 made current: a process
# that has done only this holds the driver's own memory for one context.
PRIMARY_CONTEXT = """
import ctypes, os, subprocess, sys
cuda = ctypes.CDLL("libcuda.so.1")
device, context = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0
assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0
assert cuda.cuCtxSetCurrent(context) == 0
"""
# What nvidia-smi shows for it is --context-overhead-bytes' value (docs/security.md).
CONTEXT_ONLY = (
    PRIMARY_CONTEXT
    + """
print(os.getpid(), flush=True)
sys.stdin.readline()
"""
)


def test_a_cuda_context_takes_device_memory_outside_any_allocation(box: Container) -> None:
    proc = box.python(CONTEXT_ONLY, preload=False)
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        proc.communicate("go\n", timeout=60)
    used = {int(p): int(m) for p, m in (line.split(",") for line in apps.splitlines() if line)}
    print(f"one primary context: {used.get(pid)} MiB (nvidia-smi, pid {pid})")
    assert used.get(pid, 0) > 0, apps


def test_the_agent_measures_a_context_as_nvidia_smi_shows_it(gpu: Gpu) -> None:
    """--context-overhead-bytes=auto on the real driver: NVML's count for the probe's PID."""
    backend = PynvmlBackend()
    try:
        measured = measure_gpu(gpu.uuid, backend)
    finally:
        backend.shutdown()
    print(f"the agent's measurement of one context: {measured / MiB:.0f} MiB")
    assert 0 < measured <= MAX_CONTEXT_OVERHEAD_BYTES


# The device runtime's launch pool, sized by cuCtxSetLimit(PENDING_LAUNCH_COUNT), is device
# memory the shim does not count (docs/security.md): how much it is, per pending launch.
LAUNCH_SLOTS = (
    PRIMARY_CONTEXT
    + """
def used():
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True).stdout
    return {int(p): int(m) for p, m in (l.split(",") for l in out.splitlines() if l)}[os.getpid()]
before = used()
rc = cuda.cuCtxSetLimit(4, ctypes.c_size_t(1 << 20))  # CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT
print(rc, before, used(), flush=True)
"""
)


def test_device_runtime_launch_slots_take_memory_outside_the_slice(box: Container) -> None:
    rc, before, after = (int(x) for x in box.lines(LAUNCH_SLOTS)[-1].split())
    print(f"1 Mi pending launches: rc {rc}, {before} -> {after} MiB (nvidia-smi)")
    assert rc == 0
    assert after >= before
