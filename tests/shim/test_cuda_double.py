"""cuGetProcAddress of the libcuda double answers as the real driver does: for each
requested CUDA version the newest variant of the function that both the version and the
driver know, the per-thread-default-stream variant when asked for it, and nothing newer
than the driver itself (a 12.4 driver has no cuCtxCreate_v4)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .bindings import CUDA_BINDINGS_OK
from .sandbox import Sandbox

PTDS = 2  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

RESOLVE = """
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
out = []
for name, version, flags in json.loads(sys.argv[1]):
    fn = ctypes.c_void_p()
    rc = cuda.cuGetProcAddress(name.encode(), ctypes.byref(fn), version, ctypes.c_uint64(flags))
    found = [s for s in json.loads(sys.argv[2])
             if ctypes.cast(getattr(cuda, s), ctypes.c_void_p).value == fn.value]
    out.append([rc, found[0] if found else None])
print(json.dumps(out))
"""

SYMBOLS = [
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxRelease_v2",
    "cuMemAdvise",
    "cuMemAdvise_v2",
    "cuStreamGetCaptureInfo",
    "cuStreamGetCaptureInfo_v2",
    "cuStreamGetCaptureInfo_v3",
    "cuStreamGetCaptureInfo_v3_ptsz",
    "cuStreamBeginCapture",
    "cuStreamBeginCapture_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyHtoD_v2_ptds",
    "cuMemcpyHtoDAsync_v2_ptsz",
    "cuCtxCreate_v2",
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
    "cuGetErrorName",
]


def resolve(node: Sandbox, queries: list[tuple[str, int, int]]) -> list[list[object]]:
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE, json.dumps(queries), json.dumps(SYMBOLS)],
        env=node.env(preload=None),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: list[list[object]] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize(
    ("name", "version", "flags", "expected"),
    [
        ("cuDevicePrimaryCtxRelease", 10020, 0, "cuDevicePrimaryCtxRelease"),
        ("cuDevicePrimaryCtxRelease", 12000, 0, "cuDevicePrimaryCtxRelease_v2"),
        ("cuMemAdvise", 11080, 0, "cuMemAdvise"),
        ("cuMemAdvise", 12040, 0, "cuMemAdvise_v2"),
        ("cuStreamGetCaptureInfo", 10010, 0, "cuStreamGetCaptureInfo"),
        ("cuStreamGetCaptureInfo", 11080, 0, "cuStreamGetCaptureInfo_v2"),
        ("cuStreamGetCaptureInfo", 13000, 0, "cuStreamGetCaptureInfo_v3"),
        ("cuStreamGetCaptureInfo", 12040, PTDS, "cuStreamGetCaptureInfo_v3_ptsz"),
        ("cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture"),
        ("cuStreamBeginCapture", 12000, 0, "cuStreamBeginCapture_v2"),
        ("cuMemcpyHtoD", 12000, 0, "cuMemcpyHtoD_v2"),
        ("cuMemcpyHtoD", 12000, PTDS, "cuMemcpyHtoD_v2_ptds"),
        ("cuMemcpyHtoDAsync", 12000, PTDS, "cuMemcpyHtoDAsync_v2_ptsz"),
        ("cuGetErrorName", 12000, 0, "cuGetErrorName"),
        # the default driver is 12.4: it has no cuCtxCreate_v4 (12.5) to give
        ("cuCtxCreate", 13000, 0, "cuCtxCreate_v3"),
        ("cuCtxCreate", 11000, 0, "cuCtxCreate_v2"),
    ],
)
def test_versioned_resolution_gives_the_drivers_variant(
    node: Sandbox, name: str, version: int, flags: int, expected: str
) -> None:
    assert resolve(node, [(name, version, flags)]) == [[0, expected]]


def test_a_newer_driver_gives_its_newer_variants_and_an_older_one_does_not(
    node: Sandbox,
) -> None:
    node.fake_extra.append("cuda_version=12050")
    node.write_fake_config()
    assert resolve(node, [("cuCtxCreate", 13000, 0)]) == [[0, "cuCtxCreate_v4"]]
    node.fake_extra[-1] = "cuda_version=11080"
    node.write_fake_config()
    # 500 = CUDA_ERROR_NOT_FOUND: an 11.8 driver has no variant at all of a 12.x function
    assert resolve(
        node,
        [
            ("cuStreamGetCaptureInfo", 13000, 0),
            ("cuMemAdvise", 13000, 0),
            ("cuStreamGetId", 13000, 0),
        ],
    ) == [[0, "cuStreamGetCaptureInfo_v2"], [0, "cuMemAdvise"], [500, None]]


CAPTURE = (
    CUDA_BINDINGS_OK
    + """
ok(d.cuInit(0))
dev, = ok(d.cuDeviceGet(0))
ctx, = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxSetCurrent(ctx))
s, = ok(d.cuStreamCreate(0))
ok(d.cuStreamBeginCapture(s, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
st, cid, g, deps, edges, n = ok(d.cuStreamGetCaptureInfo(s))
print("begin", int(st), int(cid) > 0, int(n))
p, = ok(d.cuMemAllocAsync(1 << 20, s))
st, cid2, g2, deps, edges, n = ok(d.cuStreamGetCaptureInfo(s))
nodes, count = ok(d.cuGraphGetNodes(g2, 4))
kind = int(d.cuGraphNodeGetType(deps[0])[1])
print("alloc", int(st), int(cid2) == int(cid), int(n), int(deps[0]) == int(nodes[0]), kind)
graph, = ok(d.cuStreamEndCapture(s))
print("end", int(ok(d.cuStreamGetCaptureInfo(s))[0]), int(graph) == int(g2))
print("free", int(ok(d.cuMemGetInfo())[0]) == int(ok(d.cuMemGetInfo())[1]))
"""
)


def test_stream_capture_queries_report_the_capture_as_it_grows(node: Sandbox) -> None:
    """cuda-bindings asks for cuStreamGetCaptureInfo by its 12.3 signature (_v3)."""
    done = subprocess.run(
        [sys.executable, "-c", CAPTURE],
        env=node.env(extra={"CUDA_PYTHON_DISABLE_MAJOR_VERSION_WARNING": "1"}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # 1 = CU_STREAM_CAPTURE_STATUS_ACTIVE, 10 = CU_GRAPH_NODE_TYPE_MEM_ALLOC
    assert done.stdout.splitlines() == [
        "begin 1 True 0",
        "alloc 1 True 1 True 10",
        "end 0 True",
        "free True",
    ]


CONTEXTS = (
    CUDA_BINDINGS_OK
    + """
import ctypes
ok(d.cuInit(0))
dev, = ok(d.cuDeviceGet(0))
ok(d.cuDevicePrimaryCtxSetFlags(dev, 4))  # CU_CTX_SCHED_BLOCKING_SYNC
print("idle", *[int(x) for x in ok(d.cuDevicePrimaryCtxGetState(dev))])
ctx, = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxSetCurrent(ctx))
state = [int(x) for x in ok(d.cuDevicePrimaryCtxGetState(dev))]
print("active", *state, int(ok(d.cuCtxGetFlags())[0]))
print("bad flags", int(d.cuDevicePrimaryCtxSetFlags(dev, 3)[0]))
# the 7.0 form refuses while the context is active: 708 = PRIMARY_CONTEXT_ACTIVE
cuda = ctypes.CDLL("libcuda.so.1")
print("v1 active", cuda.cuDevicePrimaryCtxSetFlags(0, 1))
pid1, = ok(d.cuCtxGetId(ctx))
other, = ok(d.cuCtxCreate(None, 8, dev))  # CU_CTX_MAP_HOST
pid2, = ok(d.cuCtxGetId(other))
same = int(ok(d.cuCtxGetId(ctx))[0]) == int(pid1)
print("created", int(ok(d.cuCtxGetFlags())[0]), int(pid1) != int(pid2), same)
bus, = ok(d.cuDeviceGetPCIBusId(32, dev))
bus = bus.split(b"\\0")[0].decode()
back = int(ok(d.cuDeviceGetByPCIBusId(bus.encode()))[0])
print("pci", bus, back, int(d.cuDeviceGetByPCIBusId(b"0000:99:00.0")[0]))
"""
)


def test_context_flags_ids_and_pci_addresses_are_kept(node: Sandbox) -> None:
    # cuda-bindings 13 calls cuCtxCreate with 12.5's signature (_v4): a 12.5 driver
    node.fake_extra.append("cuda_version=12050")
    node.write_fake_config()
    done = subprocess.run(
        [sys.executable, "-c", CONTEXTS],
        env=node.env(extra={"CUDA_PYTHON_DISABLE_MAJOR_VERSION_WARNING": "1"}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # 4 = CU_CTX_SCHED_BLOCKING_SYNC, 8 = CU_CTX_MAP_HOST, 1 = CUDA_ERROR_INVALID_VALUE,
    # 708 = CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, 101 = CUDA_ERROR_INVALID_DEVICE
    assert done.stdout.splitlines() == [
        "idle 4 0",
        "active 4 1 4",
        "bad flags 1",
        "v1 active 708",
        "created 8 True True",
        "pci 0000:10:00.0 0 101",
    ]


WAIT = (
    CUDA_BINDINGS_OK
    + """
import time
ok(d.cuInit(0))
ctx0, = ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0))[0]))
ctx1, = ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(1))[0]))
ok(d.cuCtxSetCurrent(ctx0))
s0, = ok(d.cuStreamCreate(0))
mod, = ok(d.cuModuleLoadData(b"image"))
fn, = ok(d.cuModuleGetFunction(mod, b"busy_20000us"))
done0, = ok(d.cuEventCreate(0))
ok(d.cuCtxSetCurrent(ctx1))
s1, = ok(d.cuStreamCreate(0))
start, = ok(d.cuEventCreate(0))
end, = ok(d.cuEventCreate(0))
ok(d.cuCtxSetCurrent(ctx0))
launched = time.perf_counter()
ok(d.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s0, 0, 0))
ok(d.cuEventRecord(done0, s0))
ok(d.cuCtxSetCurrent(ctx1))
ok(d.cuEventRecord(start, s1))
gap = (time.perf_counter() - launched) * 1000
ok(d.cuStreamWaitEvent(s1, done0, 0))  # GPU 1's stream waits for GPU 0's kernel
ok(d.cuEventRecord(end, s1))
ok(d.cuEventSynchronize(end))
print(f"{ok(d.cuEventElapsedTime(start, end))[0]:.3f} {gap:.3f}")
"""
)


def test_a_stream_waits_for_an_event_of_another_gpu(node: Sandbox) -> None:
    node.device_count = 2
    node.write_fake_config()
    node.write_limits(devices=2)
    done = subprocess.run(
        [sys.executable, "-c", WAIT],
        env=node.env(extra={"CUDA_PYTHON_DISABLE_MAJOR_VERSION_WARNING": "1"}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # GPU 1 is idle: without the wait its two events would be 0 ms apart. With it they are
    # the 20 ms kernel apart, less what of it had run when GPU 1's first event was recorded
    # (at most the host time since the launch: a loaded machine took 0.5 ms once).
    waited, gap = (float(v) for v in done.stdout.split())
    assert 20 - gap - 0.5 <= waited <= 25, (waited, gap)
