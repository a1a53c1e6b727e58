"""What NVML's process lists show inside a sliced container: its own processes, not its
neighbours'.

The driver lists every process on a GPU by host PID, whatever container it runs in; a
tenant sharing a GPU could read its neighbours' PIDs and memory from there. Two containers
share the fake GPU here, each with its own limits and region, and ``pynvml`` (NVIDIA's own
bindings) asks from inside one of them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from fracgpu import shim_abi
from tests.shim.sandbox import UUIDS, GiB, MiB, Sandbox, wait_for

# Every process-naming NVML call, through pynvml; the unversioned process list (whose
# entries hold only pid and memory) through its raw entry point.
PROBE = textwrap.dedent(
    """
    import ctypes, json, pynvml as n
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)

    def pids(procs):
        return sorted([p.pid, p.usedGpuMemory] for p in procs)

    def answer(call):
        try:
            return call()
        except n.NVMLError as e:
            return "error %d" % e.value

    class V1(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

    def unversioned(name):
        fn = n._nvmlGetFunctionPointer(name)
        count = ctypes.c_uint(8)
        entries = (V1 * 8)()
        rc = fn(h, ctypes.byref(count), entries)
        return [rc, pids(entries[: count.value])]

    def accounting():
        fn = n._nvmlGetFunctionPointer("nvmlDeviceGetAccountingPids")
        count = ctypes.c_uint(8)
        found = (ctypes.c_uint * 8)()
        rc = fn(h, ctypes.byref(count), found)
        return sorted(found[: count.value]) if rc == 0 else "error %d" % rc

    out = {
        "compute_v3": pids(n.nvmlDeviceGetComputeRunningProcesses_v3(h)),
        "compute_v2": pids(n.nvmlDeviceGetComputeRunningProcesses_v2(h)),
        "compute_v1": unversioned("nvmlDeviceGetComputeRunningProcesses"),
        "graphics": pids(n.nvmlDeviceGetGraphicsRunningProcesses(h)),
        "mps": pids(n.nvmlDeviceGetMPSComputeRunningProcesses(h)),
        "detail": answer(lambda: pids(n.nvmlDeviceGetRunningProcessDetailList(
            h, n.nvmlProcessDetailList_v1, n.NVML_PROCESS_MODE_COMPUTE))),
        "detail_wrong_version": answer(lambda: n.nvmlDeviceGetRunningProcessDetailList(
            h, n.nvmlProcessDetailList_v1 + 1, n.NVML_PROCESS_MODE_COMPUTE)),
        "utilization": answer(lambda: sorted(
            s.pid for s in n.nvmlDeviceGetProcessUtilization(h, 0))),
        "utilization_info": answer(lambda: sorted(
            s.pid for s in n.nvmlDeviceGetProcessesUtilizationInfo(h, 0))),
        "accounting": accounting(),
    }
    print(json.dumps(out))
    """
)
NOT_FOUND = "error 6"
NOT_SUPPORTED = "error 3"
VERSION_MISMATCH = "error 25"


def probe(node: Sandbox, **env_args: object) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=node.env(**env_args),  # type: ignore[arg-type]
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    answer: dict[str, object] = json.loads(out.stdout)
    return answer


def hold(node: Sandbox, *sizes: str, **env_args: object) -> subprocess.Popen[str]:
    allocations = [word for size in sizes for word in ("alloc", size)]
    holder = node.start("mem_ops", "ctx", "0", *allocations, "wait", **env_args)
    wait_for(holder, "waiting")
    return holder


def release(*holders: subprocess.Popen[str]) -> None:
    for holder in holders:
        holder.communicate("go\n", timeout=30)


@dataclass(frozen=True)
class Tenants:
    """Two sliced containers on GPU 0, each holding memory: this one (the node's limits and
    region) and a neighbour with its own."""

    mine: subprocess.Popen[str]
    theirs: subprocess.Popen[str]
    neighbour_env: dict[str, object]


@pytest.fixture
def tenants(node: Sandbox) -> Iterator[Tenants]:
    node.fake_extra = ["device.0.accounting_mode=1"]  # accounting lists pids too
    node.write_fake_config()
    node.write_limits(core=50)
    other = node.root / "neighbour"
    other.mkdir()
    limits = other / "limits"
    limits.write_bytes(
        shim_abi.encode_limits(shim_abi.Limits(devices=(shim_abi.DeviceLimits(UUIDS[0], GiB, 50),)))
    )
    neighbour_env: dict[str, object] = {
        "region": other / "region",
        "extra": {"FRACGPU_TEST_LIMITS_PATH": str(limits)},
    }
    mine = hold(node, "300Mi")
    theirs = hold(node, "200Mi", **neighbour_env)
    try:
        yield Tenants(mine, theirs, neighbour_env)
    finally:
        release(mine, theirs)


def test_a_sliced_container_lists_only_its_own_processes(node: Sandbox, tenants: Tenants) -> None:
    seen = probe(node)
    own = [[tenants.mine.pid, 300 * MiB]]
    assert seen["compute_v3"] == own
    assert seen["compute_v2"] == own
    assert seen["compute_v1"] == [0, own]
    assert seen["detail"] == own
    assert seen["graphics"] == [] and seen["mps"] == []
    assert seen["detail_wrong_version"] == VERSION_MISMATCH
    assert seen["utilization"] == NOT_FOUND
    assert seen["utilization_info"] == NOT_FOUND
    assert seen["accounting"] == NOT_SUPPORTED
    # The neighbour, asking from its own container, sees only itself.
    other = probe(node, **tenants.neighbour_env)
    assert other["compute_v3"] == [[tenants.theirs.pid, 200 * MiB]]


def test_the_driver_itself_lists_every_containers_processes(
    node: Sandbox, tenants: Tenants
) -> None:
    """What the shim hides: without it, one tenant reads the other's PID and memory."""
    seen = probe(node, preload=None)
    pids = sorted([tenants.mine.pid, tenants.theirs.pid])
    both = sorted([[tenants.mine.pid, 300 * MiB], [tenants.theirs.pid, 200 * MiB]])
    assert seen["compute_v3"] == both
    assert seen["compute_v1"] == [0, both]
    assert seen["detail"] == both
    assert seen["utilization"] == pids
    assert seen["utilization_info"] == pids
    assert seen["accounting"] == pids


def test_a_whole_gpu_container_gets_the_drivers_lists(node: Sandbox) -> None:
    node.limits_path.write_bytes(shim_abi.encode_limits(shim_abi.Limits(whole=True)))
    mine = hold(node, "300Mi")
    try:
        seen = probe(node)
        assert seen["compute_v3"] == [[mine.pid, 300 * MiB]]
        assert seen["utilization"] == [mine.pid]
    finally:
        release(mine)


def test_host_fallback_memory_is_not_listed_as_device_memory(node: Sandbox) -> None:
    node.device_memory = 512 * MiB
    node.write_fake_config()
    node.write_limits(memory=GiB, core=50, memory_host_fallback=True)
    holder = hold(node, "400Mi", "400Mi")  # the second from host memory: the GPU is full
    try:
        assert node.region().devices[0].memory_host_used == 400 * MiB
        seen = probe(node)
        assert seen["compute_v3"] == [[holder.pid, 400 * MiB]]
    finally:
        release(holder)


def test_a_full_list_says_how_many_entries_it_needs(node: Sandbox) -> None:
    node.write_limits(core=50)
    holders = [hold(node, "100Mi") for _ in range(3)]
    try:
        code = textwrap.dedent(
            """
            import ctypes, pynvml as n
            n.nvmlInit()
            h = n.nvmlDeviceGetHandleByIndex(0)
            fn = n._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
            count = ctypes.c_uint(2)
            entries = (n.c_nvmlProcessInfo_v3_t * 2)()
            print(fn(h, ctypes.byref(count), entries), count.value,
                  fn(h, ctypes.byref(ctypes.c_uint(1)), None))
            """
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=node.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.stdout.split() == ["7", "3", "2"], out.stderr  # INSUFFICIENT_SIZE; INVALID
    finally:
        release(*holders)
