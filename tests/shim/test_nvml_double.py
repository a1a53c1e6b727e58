"""The NVML test double answers pynvml the way the agent will call it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.shim.sandbox import UUIDS, GiB, MiB, Sandbox, wait_for

PROBE = textwrap.dedent(
    """
    import json, sys, pynvml as n
    n.nvmlInit()
    out = {"driver": n.nvmlSystemGetDriverVersion(), "cuda": n.nvmlSystemGetCudaDriverVersion(),
           "count": n.nvmlDeviceGetCount(), "devices": []}
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        d = {"uuid": n.nvmlDeviceGetUUID(h), "name": n.nvmlDeviceGetName(h),
             "index": n.nvmlDeviceGetIndex(h), "minor": n.nvmlDeviceGetMinorNumber(h),
             "bus": n.nvmlDeviceGetPciInfo(h).busId, "mig": n.nvmlDeviceGetMigMode(h)}
        m = n.nvmlDeviceGetMemoryInfo(h)
        m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        d["memory"] = [m.total, m.used, m.free, m2.total, m2.used]
        d["procs"] = [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
        d["util"] = n.nvmlDeviceGetUtilizationRates(h).gpu
        same = n.nvmlDeviceGetHandleByUUID(d["uuid"])
        d["by_uuid"] = n.nvmlDeviceGetIndex(same)
        out["devices"].append(d)
    print(json.dumps(out))
    """
)


def pynvml(node: Sandbox, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=node.env(preload=None),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_pynvml_sees_the_configured_devices(node: Sandbox) -> None:
    node.device_count = 2
    node.fake_extra = ["device.1.name=NVIDIA A100-SXM4-40GB", "device.1.mig_mode=1"]
    node.write_fake_config()
    out = pynvml(node, PROBE)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["driver"] == "550.54.15"
    assert info["cuda"] == 12040
    assert [d["uuid"] for d in info["devices"]] == list(UUIDS[:2])
    assert info["devices"][1]["name"] == "NVIDIA A100-SXM4-40GB"
    assert info["devices"][1]["mig"] == [1, 1]
    assert info["devices"][0]["memory"] == [4 * GiB, 0, 4 * GiB, 4 * GiB, 0]
    assert [d["by_uuid"] for d in info["devices"]] == [0, 1]
    assert info["devices"][0]["bus"] == "00000000:10:00.0"


def test_memory_and_processes_follow_the_cuda_double(node: Sandbox) -> None:
    holder = node.start("mem_ops", "ctx", "0", "alloc", "300Mi", "wait", preload=None)
    try:
        wait_for(holder, "waiting")
        info = json.loads(pynvml(node, PROBE).stdout)
        assert info["devices"][0]["memory"][:2] == [4 * GiB, 300 * MiB]
        assert info["devices"][0]["procs"] == [[holder.pid, 300 * MiB]]
    finally:
        holder.communicate("go\n", timeout=30)


def test_injected_errors_reach_a_running_process(node: Sandbox) -> None:
    code = textwrap.dedent(
        """
        import sys, pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        print("before", n.nvmlDeviceGetMemoryInfo(h).total, flush=True)
        sys.stdin.readline()
        try:
            n.nvmlDeviceGetMemoryInfo(h)
        except n.NVMLError as e:
            print("after", e.value, flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=node.env(preload=None),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    wait_for(proc, "before")
    node.fake_extra = ["device.0.nvml_error.*=15"]  # NVML_ERROR_GPU_IS_LOST
    node.write_fake_config()
    out, _ = proc.communicate("go\n", timeout=30)
    assert out.strip() == "after 15"


def test_xid_events_are_delivered(node: Sandbox) -> None:
    code = textwrap.dedent(
        """
        import pynvml as n
        n.nvmlInit()
        s = n.nvmlEventSetCreate()
        h = n.nvmlDeviceGetHandleByIndex(0)
        n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, s)
        print("ready", flush=True)
        e = n.nvmlEventSetWait(s, 10000)
        print("event", e.eventType, e.eventData, n.nvmlDeviceGetUUID(e.device), flush=True)
        try:
            n.nvmlEventSetWait(s, 50)
        except n.NVMLError_Timeout:
            print("timeout", flush=True)
        n.nvmlEventSetFree(s)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=node.env(preload=None),
        stdout=subprocess.PIPE,
        text=True,
    )
    wait_for(proc, "ready")
    with node.events_file.open("a") as f:
        f.write(f"{UUIDS[0]} 79\n")
    out, _ = proc.communicate(timeout=30)
    assert out.split("\n")[0] == f"event 8 79 {UUIDS[0]}"
    assert "timeout" in out
