"""CUDA-stack clients written by others, in containers of the tier: NVIDIA's pynvml
(nvidia-ml-py, what monitoring agents and `nvidia-smi`-like tools use), cuda-bindings
(the CUDA driver API for Python, which resolves every driver function through
cuGetProcAddress), numba-cuda (device arrays, copies, memsets) and cuda-core (memory pools,
streams, events, a kernel launch) see the slice, and all but pynvml get CUDA's
out-of-memory error past it. numba-cuda and cuda-core run the same programs as off
Kubernetes (tests/shim/test_clients.py), here as a user's pod runs them.

The image holds no Python: the Python that runs the tests and its site-packages are mounted
read-only into the pod from the host (hostPath volumes of the test pod, not something
fracgpu injects); the driver arrives through the container toolkit as for any GPU pod."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from fracgpu import names
from tests.shim.bindings import CUDA_BINDINGS_OK
from tests.shim.test_clients import CUDA_CORE, NUMBA, check_cuda_core, numba_expected

from .pods import GIB, pod_body, run_probe, sections
from .tier.tier import GPU_UUID, PYTHON_PREFIX, PYTHON_SITE, NodeTier, cuda_runtime

PYNVML = """
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
m = n.nvmlDeviceGetMemoryInfo(h)
uuid = n.nvmlDeviceGetUUID(h)
print(n.nvmlDeviceGetCount(), uuid.decode() if isinstance(uuid, bytes) else uuid, m.total, m.used)
"""


# Where the host's Python prefix is mounted: a path of its own, so a system Python (/usr)
# does not shadow the image's /usr, where the container toolkit puts the driver.
MOUNTED_PREFIX = Path("/opt/host-python")

CUDA_BINDINGS = (
    CUDA_BINDINGS_OK
    + """
ok(d.cuInit(0))
dev, = ok(d.cuDeviceGet(0))
ctx, = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxSetCurrent(ctx))
free, total = ok(d.cuMemGetInfo())
print("info", int(free), int(total))
print("over", int(d.cuMemAlloc(total + 1)[0]))
print("half", int(d.cuMemAlloc(total // 2)[0]), int(d.cuMemAlloc(total // 2)[0]))
print("more", int(d.cuMemAlloc(1 << 20)[0]))
"""
)


def client_pod(name: str, limits: dict[str, str], code: str) -> dict[str, Any]:
    binary = Path(os.path.realpath(sys.executable))
    if not binary.is_relative_to(PYTHON_PREFIX):
        pytest.skip(f"the test's Python {binary} is not under its prefix {PYTHON_PREFIX}")
    python = MOUNTED_PREFIX / binary.relative_to(PYTHON_PREFIX)
    script = (
        f'{{ echo "== client"; {python} -c "$CLIENT_CODE"; echo "exit=$?"; }}'
        " > /dev/termination-log 2>&1"
    )
    body = pod_body(name, limits=limits, command=script)
    container = body["spec"]["containers"][0]
    container["env"] = [
        # Site-packages is mounted, not installed: its .pth files (numba-cuda's redirect of
        # numba.cuda to itself) are read only for a site directory, not for PYTHONPATH.
        {"name": "CLIENT_CODE", "value": f"import site; site.addsitedir('/site')\n{code}"},
        {"name": "PYTHONHOME", "value": str(MOUNTED_PREFIX)},
        {"name": "PYTHONPATH", "value": "/site"},
        # a Python built with a shared libpython finds it by an absolute RUNPATH
        {"name": "LD_LIBRARY_PATH", "value": str(MOUNTED_PREFIX / "lib")},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "CUDA_PYTHON_DISABLE_MAJOR_VERSION_WARNING", "value": "1"},
    ]
    container["volumeMounts"] = [
        {"name": "python", "mountPath": str(MOUNTED_PREFIX), "readOnly": True},
        {"name": "site", "mountPath": "/site", "readOnly": True},
    ]
    body["spec"]["volumes"] = [
        {"name": "python", "hostPath": {"path": str(PYTHON_PREFIX), "type": "Directory"}},
        {"name": "site", "hostPath": {"path": str(PYTHON_SITE), "type": "Directory"}},
    ]
    return body


def test_pynvml_in_a_container_sees_the_slice(node_tier: NodeTier, namespace: str) -> None:
    limits = {names.RESOURCE_VCUDA_CORE: "25", names.RESOURCE_VCUDA_MEMORY: "12"}  # 3 GiB
    report = run_probe(node_tier, namespace, client_pod("pynvml", limits, PYNVML))
    lines = sections(report)["client"]
    assert lines[-1] == "exit=0", report
    count, uuid, total, used = lines[0].split()
    assert (count, uuid, int(total), int(used)) == ("1", GPU_UUID, 3 * GIB, 0), report


def test_cuda_bindings_in_a_container_sees_the_slice_and_runs_out_of_memory_past_it(
    node_tier: NodeTier, namespace: str
) -> None:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048", "nvidia.com/gpucores": "30"}
    report = run_probe(node_tier, namespace, client_pod("bindings", limits, CUDA_BINDINGS))
    lines = sections(report)["client"]
    assert lines[-1] == "exit=0", report
    slice_bytes = 2 * GIB
    # 2 = CUDA_ERROR_OUT_OF_MEMORY, 0 = CUDA_SUCCESS
    assert lines[:-1] == [
        f"info {slice_bytes} {slice_bytes}",
        "over 2",
        "half 0 0",
        "more 2",
    ], report


def test_numba_cuda_in_a_container_sees_the_slice_and_runs_out_of_memory_past_it(
    node_tier: NodeTier, namespace: str
) -> None:
    pytest.importorskip("numba.cuda")
    if not cuda_runtime():
        pytest.skip("numba-cuda needs the CUDA runtime (libcudart) in the image; the host has none")
    limits = {names.RESOURCE_VCUDA_CORE: "20", names.RESOURCE_VCUDA_MEMORY: "4"}  # 1 GiB
    report = run_probe(node_tier, namespace, client_pod("numba", limits, NUMBA), timeout=180)
    lines = sections(report)["client"]
    assert lines[-1] == "exit=0", report
    assert lines[:-1] == numba_expected(GIB), report


def test_cuda_core_in_a_container_sees_the_slice_and_runs_out_of_memory_past_it(
    node_tier: NodeTier, namespace: str
) -> None:
    pytest.importorskip("cuda.core")
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1536", "nvidia.com/gpucores": "20"}
    report = run_probe(node_tier, namespace, client_pod("core", limits, CUDA_CORE), timeout=180)
    lines = sections(report)["client"]
    assert lines[-1] == "exit=0", report
    check_cuda_core(lines[:-1], 1536 << 20)
