"""CUDA clients written by others, on the real driver under the shim: each sees its slice
as the GPU's memory, gets CUDA's out-of-memory error past it, and computes correctly
inside it. The memory programs are the ones run on the fake driver (tests/shim) and in
tier pods (tests/node); the kernels here are real ones, compiled on the machine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.shim.bindings import CUDA_BINDINGS_OK
from tests.shim.test_clients import (
    CUDA_BINDINGS_MEMORY,
    CUDA_CORE_MEMORY,
    NUMBA,
    cuda_bindings_memory_expected,
    cuda_core_memory_expected,
    numba_expected,
)

from .container import Container, GiB

pytestmark = pytest.mark.gpu

SLICE = 2 * GiB  # the box fixture's slice
HERE = Path(__file__).parent


def needs(box: Container, module: str) -> None:
    if not box.imports(module):
        pytest.skip(f"no {module} in {box.gpu.python}")


NUMBA_KERNEL = """
import numpy as np
# numba-cuda's compiler still names np.row_stack, which numpy 2.5 removed (seen on the GPU
# machine's image); its own alias keeps the JIT usable there
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
from numba import cuda
@cuda.jit
def axpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]
n = 1 << 22
x = np.arange(n, dtype=np.float32)
y = np.ones(n, dtype=np.float32)
out = cuda.device_array(n, dtype=np.float32)
axpy[(n + 255) // 256, 256](out, np.float32(2), cuda.to_device(x), cuda.to_device(y))
print("axpy", bool(np.array_equal(out.copy_to_host(), 2 * x + y)))
free, total = cuda.current_context().get_memory_info()
print("used", total - free)
"""


def test_numba_cuda_sees_the_slice_and_runs_out_of_memory_past_it(box: Container) -> None:
    needs(box, "numba.cuda")
    assert box.lines(NUMBA) == numba_expected(SLICE)


def test_numba_cuda_jit_kernel_computes_inside_the_slice(box: Container) -> None:
    needs(box, "numba.cuda")
    status, output = box.run(NUMBA_KERNEL, preload=False)
    if status != 0:
        pytest.skip(f"numba's JIT fails without the shim too: {output.splitlines()[-1]}")
    # three arrays of 16 MiB: the slice counts exactly what the program allocated
    assert box.lines(NUMBA_KERNEL) == ["axpy True", f"used {3 * (4 << 22)}"]


CUDA_CORE_KERNEL = """
import numpy as np
from cuda.bindings import driver
from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
dev = Device(0)
dev.set_current()
stream = dev.create_stream()
source = '''
extern "C" __global__ void fill(unsigned *p, unsigned v, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + (unsigned)i;
}'''
program = Program(source, code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}"))
kernel = program.compile("cubin").get_kernel("fill")
n = 1 << 20
buf = dev.memory_resource.allocate(4 * n, stream=stream)
launch(stream, LaunchConfig(grid=(n + 255) // 256, block=256), kernel, buf, np.uint32(7),
       np.uint64(n))
host = np.zeros(n, np.uint32)
stream.sync()
driver.cuMemcpyDtoH(host.ctypes.data, int(buf.handle), 4 * n)
print("fill", bool((host == 7 + np.arange(n, dtype=np.uint32)).all()))
"""


def test_cuda_core_sees_the_slice_and_runs_a_compiled_kernel(box: Container) -> None:
    needs(box, "cuda.core")
    assert box.lines(CUDA_CORE_MEMORY) == cuda_core_memory_expected(SLICE)
    assert box.lines(CUDA_CORE_KERNEL) == ["fill True"]


def test_cuda_bindings_and_pynvml_see_the_slice(box: Container) -> None:
    needs(box, "cuda.bindings")
    needs(box, "pynvml")
    assert box.lines(CUDA_BINDINGS_MEMORY) == cuda_bindings_memory_expected(SLICE)


# The slice as CuPy sees it, past it, half of it, and past what is left (a is held).
CUPY_SLICE = """
free, total = cp.cuda.runtime.memGetInfo()
print("info", free, total)
def alloc(n):
    try:
        return cp.empty(n, dtype=cp.uint8), "ok"
    except cp.cuda.memory.OutOfMemoryError:
        return None, "oom"
print("over", alloc(total + 1)[1])
a, ra = alloc(total // 2)
print("half", ra)
print("more", alloc(total // 2 + (64 << 20))[1])
"""
CUPY_SLICE_SEEN = [f"info {SLICE} {SLICE}", "over oom", "half ok", "more oom"]

CUPY = (
    """
import cupy as cp
import numpy as np
"""
    + CUPY_SLICE
    + """
del a
cp.get_default_memory_pool().free_all_blocks()
rng = np.random.default_rng(3)
x = rng.standard_normal((1024, 1024), dtype=np.float32)
y = rng.standard_normal((1024, 1024), dtype=np.float32)
product = cp.asnumpy(cp.asarray(x) @ cp.asarray(y))
print("matmul", bool(np.allclose(product, x @ y, rtol=1e-3, atol=1e-3)))
"""
)


def test_cupy_sees_the_slice_runs_out_of_memory_past_it_and_multiplies(box: Container) -> None:
    needs(box, "cupy")
    assert box.lines(CUPY) == [*CUPY_SLICE_SEEN, "matmul True"]


JAX = """
import json
import jax
import jax.numpy as jnp
device = jax.devices("gpu")[0]
limit = device.memory_stats()["bytes_limit"]
x = jnp.arange(1 << 10, dtype=jnp.float32)
total = float(jnp.sum(x * 2))
try:
    jnp.zeros(({slice_bytes} // 4,), dtype=jnp.float32).block_until_ready()
    whole = "ok"
except Exception as e:  # XlaRuntimeError: RESOURCE_EXHAUSTED
    whole = "RESOURCE_EXHAUSTED" if "RESOURCE_EXHAUSTED" in str(e) else repr(e)
print(json.dumps({{"limit": limit, "sum": total, "whole": whole}}))
"""


def test_jax_preallocates_from_the_slice_not_the_gpu(box: Container) -> None:
    needs(box, "jax")
    got = box.result(JAX.format(slice_bytes=SLICE))
    # XLA takes 75 % of the memory the driver reports free: the slice's, not the GPU's
    limit = got["limit"]
    assert isinstance(limit, int) and 0.70 * SLICE <= limit <= 0.76 * SLICE, got
    assert got["sum"] == float((1 << 10) * ((1 << 10) - 1))
    assert got["whole"] == "RESOURCE_EXHAUSTED", got


TORCH_EXPANDABLE = """
import json, os
# set by the workload itself, as a tenant may: PyTorch then maps physical chunks with the
# virtual memory API (cuMemCreate / cuMemMap) instead of cudaMalloc
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
import torch
free, total = torch.cuda.mem_get_info()
def alloc(n):
    try:
        return torch.empty(n, dtype=torch.uint8, device="cuda"), "ok"
    except torch.OutOfMemoryError:
        return None, "oom"
over = alloc(total + (1 << 20))[1]
a, half = alloc(total // 2)
more = alloc(total // 2 + (64 << 20))[1]
segments = torch.cuda.memory_snapshot()
expandable = bool(segments) and all(s.get("is_expandable", False) for s in segments)
a.fill_(7)
torch.cuda.synchronize()
print(json.dumps({"total": total, "over": over, "half": half, "more": more,
                  "expandable": expandable, "sum": int(a[:1024].sum())}))
"""


def test_pytorch_expandable_segments_stay_inside_the_slice(box: Container) -> None:
    # Expandable segments allocate through cuMemCreate, not cudaMalloc: a tenant who turns
    # them on still gets the slice and CUDA's out-of-memory error past it.
    got = box.result(TORCH_EXPANDABLE)
    assert got == {
        "total": SLICE,
        "over": "oom",
        "half": "ok",
        "more": "oom",
        "expandable": True,
        "sum": 7 * 1024,
    }, got


CUPY_MANAGED = (
    """
import cupy as cp
# every CuPy allocation becomes cudaMallocManaged, which the driver would let grow past
# the GPU's memory: under the shim it is the container's memory like any other
cp.cuda.set_allocator(cp.cuda.MemoryPool(cp.cuda.malloc_managed).malloc)
"""
    + CUPY_SLICE
    + """
a.fill(3)
print("sum", int(a[:1024].sum()))
"""
)


def test_cupy_managed_memory_counts_against_the_slice(box: Container) -> None:
    needs(box, "cupy")
    assert box.lines(CUPY_MANAGED) == [*CUPY_SLICE_SEEN, f"sum {3 * 1024}"]


def test_a_program_built_by_nvcc_with_the_static_runtime_sees_the_slice(
    box: Container, tmp_path: Path
) -> None:
    # nvcc links cudart statically by default: most C++ inference servers reach the driver
    # that way, through dlopen and cuGetProcAddress.
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    exe = tmp_path / "static_cudart"
    subprocess.run(
        [nvcc, "-O2", "-cudart", "static", "-o", str(exe), str(HERE / "static_cudart.cu")],
        check=True,
        timeout=300,
    )
    done = subprocess.run(
        [str(exe)], env=box.env(), capture_output=True, text=True, timeout=120, check=False
    )
    print(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    # 2 = cudaErrorMemoryAllocation
    assert done.stdout.splitlines() == [
        f"info 0 {SLICE}",
        "over 2",
        "half 0",
        "more 2",
        "managed 2",
        f"kernel 0 {1 << 24}",
    ]


# A kernel with 16 KiB of local memory per thread: at launch the driver raises the stack
# for every resident thread (about 4.3 GiB on an H200), which does not fit a 2 GiB slice.
DEEP_STACK = """
import json
from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
dev = Device(0)
dev.set_current()
stream = dev.create_stream()
source = '''
extern "C" __global__ void deep(int *out) {
    volatile int a[4096];
    for (int i = 0; i < 4096; i++) a[i] = i * (int)threadIdx.x;
    out[threadIdx.x] = a[(threadIdx.x * 7) % 4096];
}'''
program = Program(source, code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}"))
kernel = program.compile("cubin").get_kernel("deep")
out = dev.memory_resource.allocate(4 * 256, stream=stream)
try:
    launch(stream, LaunchConfig(grid=1, block=256), kernel, out)
    stream.sync()
    result = "ran"
except Exception as e:  # cuda.core raises CUDAError naming the driver's code
    result = "CUDA_ERROR_OUT_OF_MEMORY" if "OUT_OF_MEMORY" in str(e) else repr(e)
print(json.dumps({"result": result, "local": kernel.attributes.local_size_bytes()}))
"""


# The same kind of kernel as the one node of a graph (cuda-bindings, no parameters): the
# graph's launch would raise the stack the same way.
DEEP_STACK_GRAPH = (
    CUDA_BINDINGS_OK
    + """
import json
from cuda.core import Device, Program, ProgramOptions
dev = Device(0)
dev.set_current()
source = '''
extern "C" __global__ void deep() {
    volatile int a[4096];
    for (int i = 0; i < 4096; i++) a[i] = i * (int)threadIdx.x;
    if (a[(threadIdx.x * 7) % 4096] == -1) asm("trap;");
}'''
program = Program(source, code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}"))
mod, = ok(d.cuModuleLoadData(program.compile("cubin").code))
fn, = ok(d.cuModuleGetFunction(mod, b"deep"))
g, = ok(d.cuGraphCreate(0))
p = d.CUDA_KERNEL_NODE_PARAMS()
p.func = fn
p.gridDimX = p.gridDimY = p.gridDimZ = 1
p.blockDimX, p.blockDimY, p.blockDimZ = 256, 1, 1
ok(d.cuGraphAddKernelNode(g, None, 0, p))
err, e = d.cuGraphInstantiate(g, 0)
result = err.name
if err == d.CUresult.CUDA_SUCCESS:
    err, = d.cuGraphLaunch(e, None)
    if err == d.CUresult.CUDA_SUCCESS:
        err = d.cuCtxSynchronize()[0]
    result = "ran" if err == d.CUresult.CUDA_SUCCESS else err.name
print(json.dumps({"result": result}))
"""
)


@pytest.mark.parametrize("program", [DEEP_STACK, DEEP_STACK_GRAPH], ids=["launch", "graph"])
def test_a_kernel_whose_stack_passes_the_slice_is_refused(box: Container, program: str) -> None:
    needs(box, "cuda.core")
    alone = box.result(program, preload=False)
    print(f"deep kernel, no shim: {alone}")
    if alone["result"] != "ran":
        pytest.skip(f"the kernel does not run without the shim either: {alone}")
    got = box.result(program)
    print(f"deep kernel, 2 GiB slice: {got}")
    assert got["result"] == "CUDA_ERROR_OUT_OF_MEMORY", got


# Holds 256 MiB, then lists the GPU's compute processes through pynvml and nvidia-smi.
NVML_PROCESSES = """
import json, os, subprocess, torch, pynvml
held = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
uuid = os.environ["CUDA_VISIBLE_DEVICES"]
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
nvml = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
smi = subprocess.run(
    ["nvidia-smi", "-i", uuid, "--query-compute-apps=pid", "--format=csv,noheader"],
    capture_output=True, text=True, check=True,
)
smi_pids = sorted(int(x) for x in smi.stdout.split())
print(json.dumps({"me": os.getpid(), "nvml": nvml, "smi": smi_pids}))
"""
HOLD = """
import os, sys, torch
held = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(os.getpid(), flush=True)
sys.stdin.readline()
"""


def test_nvml_lists_only_the_containers_own_processes(box: Container, tmp_path: Path) -> None:
    """On the real driver, which lists every process on the GPU by host PID: a neighbour's
    process is in the driver's list, and not in what a sliced container sees."""
    needs(box, "pynvml")
    neighbour = Container(tmp_path / "neighbour", box.gpu)
    neighbour.limit(2 * GiB)
    holder = neighbour.python(HOLD)
    try:
        assert holder.stdout is not None
        theirs = int(holder.stdout.readline())
        driver = box.result(NVML_PROCESSES, preload=False)
        sliced = box.result(NVML_PROCESSES)
    finally:
        holder.communicate("\n", timeout=60)
    print(f"driver's list: {driver}; under the shim: {sliced}")
    assert str(theirs) in driver["nvml"] and theirs in driver["smi"]  # type: ignore[operator]
    mine = sliced["me"]
    listed = sliced["nvml"]
    assert isinstance(listed, dict) and list(listed) == [str(mine)], sliced
    # what the shim counted for it: the tensor, and whatever else PyTorch allocated
    assert 256 * 2**20 <= listed[str(mine)] <= 320 * 2**20, sliced
    assert sliced["smi"] == [mine]
