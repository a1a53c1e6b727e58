"""CUDA clients written by others, run under the shim and the fake driver without
Kubernetes: each sees its slice as the GPU's memory and gets CUDA's out-of-memory error
past it. numba-cuda runs device arrays (its kernels need NVVM and libdevice, which are
not here); the copies go through the fake driver's memcpy, which moves real bytes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .bindings import CUDA_BINDINGS_OK
from .sandbox import GiB, Sandbox

SLICE = GiB  # the slice the limits file gives; the fake GPU has 4 GiB


def run_client(node: Sandbox, code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=node.env(extra={"CUDA_PYTHON_DISABLE_MAJOR_VERSION_WARNING": "1"}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


NUMBA = """
import numpy as np
from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError
def alloc(n):
    try:
        return cuda.device_array(n, dtype=np.uint8), "ok"
    except CudaAPIError as e:
        return None, f"error {int(e.code)}"
free, total = cuda.current_context().get_memory_info()
print("info", free, total)
print("over", alloc(total + 1)[1])
a, ra = alloc(total // 2)
b, rb = alloc(total // 2)
print("half", ra, rb)
print("more", alloc(1 << 20)[1])
del a, b
cuda.current_context().deallocations.clear()
src = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8)
d = cuda.to_device(src)
e = cuda.device_array_like(d)
e.copy_to_device(d)
print("roundtrip", int((e.copy_to_host() == src).sum()), src.size)
cuda.driver.device_memset(e, 0x5A, 4096)
out = e.copy_to_host()
print("memset", int((out[:4096] == 0x5A).sum()), int((out[4096:] == src[4096:]).sum()))
"""


def numba_expected(slice_bytes: int) -> list[str]:
    """What NUMBA prints in a slice of ``slice_bytes`` (also run in tier pods, tests/node)."""
    rest = (1 << 20) - 4096
    # 2 = CUDA_ERROR_OUT_OF_MEMORY
    return [
        f"info {slice_bytes} {slice_bytes}",
        "over error 2",
        "half ok ok",
        "more error 2",
        f"roundtrip {1 << 20} {1 << 20}",
        f"memset 4096 {rest}",
    ]


def test_numba_cuda_sees_the_slice_copies_bytes_and_runs_out_of_memory_past_it(
    node: Sandbox,
) -> None:
    pytest.importorskip("numba.cuda")
    assert run_client(node, NUMBA) == numba_expected(SLICE)


CUDA_CORE_MEMORY = """
import numpy as np
from cuda.bindings import driver
from cuda.core import Device
from cuda.core._utils.cuda_utils import CUDAError
dev = Device(0)
dev.set_current()
stream = dev.create_stream()
pool = dev.memory_resource  # the device's memory pool
def alloc(n):
    try:
        return pool.allocate(n, stream=stream), "ok"
    except CUDAError as e:
        return None, str(e).split(":")[0]
_, free, total = driver.cuMemGetInfo()
print("info", free, total)
print("over", alloc(total + 1)[1])
a, ra = alloc(total // 2)
b, rb = alloc(total // 2)
print("half", ra, rb)
print("more", alloc(1 << 20)[1])
a.close(stream)
b.close(stream)
stream.sync()
# the pool keeps what was freed (cuda-core sets no release threshold) and serves it again
print("reuse", alloc(total // 2)[1], driver.cuMemGetInfo()[1])
x, _ = alloc(4096)
y, _ = alloc(4096)
x.fill(0x5A, stream=stream)
y.copy_from(x, stream=stream)
host = np.zeros(4096, np.uint8)
stream.sync()
driver.cuMemcpyDtoH(host.ctypes.data, int(y.handle), 4096)
print("copy", int((host == 0x5A).sum()))
event = stream.record()
event.sync()
print("event", event.is_done)
"""

KERNEL_MS = 20
# a kernel through cuLibraryLoadData/cuLibraryGetKernel: the fake driver runs it for the
# time in its name, on the device's timeline, between two timing events
CUDA_CORE = (
    CUDA_CORE_MEMORY
    + f"""
from cuda.core import EventOptions, LaunchConfig, ObjectCode, launch
kernel = ObjectCode.from_cubin(b"\\x7fELF", name="k").get_kernel("busy_{KERNEL_MS * 1000}us")
timed = EventOptions(timing_enabled=True)
start = stream.record(options=timed)
launch(stream, LaunchConfig(grid=1, block=32), kernel)
end = stream.record(options=timed)
end.sync()
print("kernel", round(end - start, 2))
"""
)
# The kernel cannot take less than its time; a loaded machine delays the event after it a
# little (21 ms was seen under CI), a broken timeline or pacing by much more.
KERNEL_LATE_MS = 15


def cuda_core_memory_expected(slice_bytes: int) -> list[str]:
    """What CUDA_CORE_MEMORY prints in a slice of ``slice_bytes`` (also on a real GPU)."""
    return [
        f"info {slice_bytes} {slice_bytes}",
        "over CUDA_ERROR_OUT_OF_MEMORY",
        "half ok ok",
        "more CUDA_ERROR_OUT_OF_MEMORY",
        "reuse ok 0",
        "copy 4096",
        "event True",
    ]


def check_cuda_core(lines: list[str], slice_bytes: int) -> None:
    """CUDA_CORE's output in a slice of ``slice_bytes`` (also run in tier pods)."""
    assert lines[:-1] == cuda_core_memory_expected(slice_bytes), lines
    name, ms = lines[-1].split()
    assert name == "kernel", lines
    assert KERNEL_MS - 0.01 <= float(ms) <= KERNEL_MS + KERNEL_LATE_MS, lines


def test_cuda_core_sees_the_slice_runs_out_of_memory_past_it_and_launches(node: Sandbox) -> None:
    pytest.importorskip("cuda.core")
    check_cuda_core(run_client(node, CUDA_CORE), SLICE)


CUDA_BINDINGS_MEMORY = (
    CUDA_BINDINGS_OK
    + """
import numpy as np
import pynvml
ok(d.cuInit(0))
dev, = ok(d.cuDeviceGet(0))
ctx, = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxPushCurrent(ctx))
free, total = ok(d.cuMemGetInfo())
print("info", int(free), int(total))
print("over", int(d.cuMemAlloc(total + 1)[0]))
a, = ok(d.cuMemAlloc(total // 2))
b, = ok(d.cuMemAlloc(total // 2))
print("more", int(d.cuMemAlloc(1 << 20)[0]))
src = np.arange(1 << 18, dtype=np.uint32)
back = np.zeros_like(src)
ok(d.cuMemcpyHtoD(a, src.ctypes.data, src.nbytes))
ok(d.cuMemcpyDtoD(int(b) + 4096, a, src.nbytes))
ok(d.cuMemcpyDtoH(back.ctypes.data, int(b) + 4096, src.nbytes))
print("copy", int((back == src).sum()))
popped, = ok(d.cuCtxPopCurrent())
print("popped", int(popped) == int(ctx), int(d.cuMemAlloc(1)[0]))
pynvml.nvmlInit()
info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
print("nvml", info.total, info.used, info.free)
"""
)
# The fake driver checks a copy against the allocation it lands in; the real one may not
# (the next allocation can follow), so this part runs on the fake driver only.
CUDA_BINDINGS = (
    CUDA_BINDINGS_MEMORY
    + """
ok(d.cuCtxPushCurrent(ctx))
print("past", int(d.cuMemcpyHtoD(int(b) + total // 2 - 8, src.ctypes.data, 16)[0]))
"""
)


def cuda_bindings_memory_expected(slice_bytes: int) -> list[str]:
    """What CUDA_BINDINGS_MEMORY prints in a slice of ``slice_bytes`` (also on a real GPU)."""
    # 2 = CUDA_ERROR_OUT_OF_MEMORY, 201 = INVALID_CONTEXT
    return [
        f"info {slice_bytes} {slice_bytes}",
        "over 2",
        "more 2",
        f"copy {1 << 18}",
        "popped True 201",
        f"nvml {slice_bytes} {slice_bytes} 0",
    ]


def test_cuda_bindings_and_pynvml_see_the_slice_and_run_out_of_memory_past_it(
    node: Sandbox,
) -> None:
    # 1 = CUDA_ERROR_INVALID_VALUE
    assert run_client(node, CUDA_BINDINGS) == [*cuda_bindings_memory_expected(SLICE), "past 1"]


NUMBA_PINNED = """
import numpy as np
from cuda.bindings import driver
from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError
pinned = cuda.pinned_array(1 << 16, dtype=np.uint32)
pinned[:] = np.arange(1 << 16)
dev = cuda.to_device(pinned)
out = cuda.pinned_array_like(pinned)
dev.copy_to_host(out)
print("pinned", int((out == pinned).sum()))
mapped = cuda.mapped_array(16, dtype=np.uint8)
print("mapped", mapped.device_ctypes_pointer.value == mapped.ctypes.data)
free, total = cuda.current_context().get_memory_info()
print("device", total - free)
inner = dev.device_ctypes_pointer.value + 8
_, base, size = driver.cuMemGetAddressRange(inner)
print("range", int(base) == dev.device_ctypes_pointer.value, size)
managed = cuda.managed_array(1024, dtype=np.uint32)
managed[:] = np.arange(1024)  # the host writes managed memory at its device address
seen = np.zeros(1024, dtype=np.uint32)
driver.cuMemcpyDtoH(seen.ctypes.data, managed.device_ctypes_pointer.value, seen.nbytes)
free, total = cuda.current_context().get_memory_info()
print("managed", int((seen == np.arange(1024)).sum()), total - free)
try:
    cuda.pinned_array(64 << 20, dtype=np.uint8)
    print("host ok")
except CudaAPIError as e:
    print("host error", int(e.code))
"""


def test_numba_cuda_pinned_and_mapped_memory_take_host_memory_not_the_slice(
    node: Sandbox,
) -> None:
    pytest.importorskip("numba.cuda")
    node.fake_extra.append(f"host_memory_bytes={32 << 20}")
    node.write_fake_config()
    lines = run_client(node, NUMBA_PINNED)
    assert lines == [
        f"pinned {1 << 16}",
        "mapped True",
        f"device {(1 << 16) * 4}",  # the device array only
        f"range True {(1 << 16) * 4}",
        # the shim counts managed memory against the slice (the GPU may page it in)
        f"managed 1024 {(1 << 16) * 4 + 4096}",
        "host error 2",  # 64 MiB pinned past the host's 32 MiB
    ]
