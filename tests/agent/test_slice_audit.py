"""The agent's check of NVML's per-process accounting against the pods' slices: what a
process took without the shim (a private driver copy, raw ioctls) is seen and acted on.

Real processes allocate through the libcuda test double, which records device memory per
PID in the simulated hardware that the NVML double reports through
nvmlDeviceGetComputeRunningProcesses. The "without the shim" process stands for one that
reached the driver around it. Each PID's cgroup file (the pod UID in kubelet's cgroup
naming) is written into a stand-in for the host's /proc, since the test processes are
not in pod cgroups.
"""

import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.containers import LiveContainer
from agent.hostfiles import AllocationFiles, allocation_key
from agent.nvml_backend import PynvmlBackend
from agent.settings import SettingsError, parse_settings
from agent.slice_audit import (
    DETECTIONS_KEPT_SECONDS,
    SliceAudit,
    SliceAuditSettings,
    find_overruns,
    kill_if_in_pod,
    pod_uid_of,
)
from fracgpu.names import RESOURCE_VCUDA_CORE
from fracgpu.shim_abi import DeviceLimits, Limits, encode_limits
from tests.agent.agent_process import AgentProcess, write_unused_kubeconfig
from tests.agent.kubelet import ContainerRef, TestKubelet
from tests.agent.nvml_double import (
    SHIM_BUILD,
    NvmlDouble,
    double_in_this_process,
)
from tests.promtext import samples

GIB = 1 << 30
GPU = "GPU-fa4e0000-0000-4000-8000-0000000000a0"
POD_UID = "0e6f1c2a-1111-2222-3333-444455556666"
WORKLOAD = SHIM_BUILD / "tests" / "mem_ops"


@pytest.fixture(scope="session")
def state_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The NVML double maps its simulated hardware once per process (pynvml runs in this
    # one): every test of the session shares it; dead workloads' memory is reclaimed.
    return tmp_path_factory.mktemp("gpu") / "gpu.state"


@pytest.fixture
def double(short_dir: Path, state_file: Path, monkeypatch: pytest.MonkeyPatch) -> NvmlDouble:
    return double_in_this_process(
        short_dir,
        monkeypatch,
        state_file=str(state_file),
        device_count=1,
        device__0__uuid=GPU,
        device__0__memory_bytes=24 * GIB,
    )


def _container(slice_bytes: int = GIB, counted_context: int = 0) -> LiveContainer:
    limits = Limits(
        devices=(DeviceLimits(GPU, slice_bytes, 50),),
        namespace="team-a",
        pod="trainer",
        container="main",
        pod_uid=POD_UID,
        context_overhead_bytes=counted_context,
    )
    return LiveContainer("team-a", "trainer", "main", ("k",), limits, None)


def _in_pod(proc: Path, pid: int, uid: str = POD_UID) -> None:
    (proc / str(pid)).mkdir(parents=True)
    slice_name = uid.replace("-", "_")
    (proc / str(pid) / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{slice_name}.slice/cri-containerd-0123abcd.scope\n"
    )


def _allocating(double: NvmlDouble, size: str, shim: bool, limits: Path) -> subprocess.Popen[str]:
    env = {**double.env(), "FRACGPU_TEST_LIMITS_PATH": str(limits)}
    env["FRACGPU_TEST_REGION_PATH"] = str(limits.parent / "region")
    if shim:
        env["LD_PRELOAD"] = str(SHIM_BUILD / "libfracgpu-test.so")
    proc = subprocess.Popen(
        [str(WORKLOAD), "ctx", "0", "alloc", size, "wait"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("waiting"):
            return proc
    raise AssertionError(f"workload ended early: {proc.stderr.read() if proc.stderr else ''}")


def _stop(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate()


def _samples(audit: SliceAudit) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(audit)
    return samples(generate_latest(registry).decode())


def test_memory_taken_around_the_shim_is_detected_and_counted(
    backend: PynvmlBackend, double: NvmlDouble, tmp_path: Path
) -> None:
    limits = tmp_path / "limits"
    limits.write_bytes(encode_limits(_container().limits))  # type: ignore[arg-type]
    proc_dir = tmp_path / "proc"
    escaped = _allocating(double, "3Gi", shim=False, limits=limits)  # past its 1 GiB slice
    try:
        _in_pod(proc_dir, escaped.pid)
        live = [_container()]
        now = [0.0]
        audit = SliceAudit(
            backend,
            lambda: list(live),
            SliceAuditSettings(proc_dir=proc_dir),
            clock=lambda: now[0],
        )
        (found,) = audit.run_once()
        assert (found.namespace, found.pod, found.gpu) == ("team-a", "trainer", GPU.lower())
        assert (found.used_bytes, found.slice_bytes, found.pids) == (3 * GIB, GIB, (escaped.pid,))
        samples = _samples(audit)
        labels = f'{{gpu="{GPU.lower()}",namespace="team-a",pod="trainer"}}'
        assert samples[f"fracgpu_pod_memory_over_slice_bytes{labels}"] == 2 * GIB
        assert samples[f"fracgpu_slice_bypass_detections_total{labels}"] == 1
        assert samples["fracgpu_slice_bypass_kills_total"] == 0
        assert escaped.poll() is None  # killing is off by default
        # A while after the pod is gone, so is its count: no series per pod ever caught,
        # but scrapes in between still see it.
        live.clear()
        _stop(escaped)
        audit.run_once()
        now[0] = DETECTIONS_KEPT_SECONDS - 1
        audit.run_once()
        assert _samples(audit)[f"fracgpu_slice_bypass_detections_total{labels}"] == 1
        now[0] = DETECTIONS_KEPT_SECONDS
        audit.run_once()
        assert not [s for s in _samples(audit) if s.startswith("fracgpu_slice_bypass_detections")]
    finally:
        _stop(escaped)


def test_a_pod_within_its_slice_or_held_by_the_shim_is_not_reported(
    backend: PynvmlBackend, double: NvmlDouble, tmp_path: Path
) -> None:
    limits = tmp_path / "limits"
    limits.write_bytes(encode_limits(_container().limits))  # type: ignore[arg-type]
    proc_dir = tmp_path / "proc"
    within = _allocating(double, "900Mi", shim=False, limits=limits)
    shimmed = _allocating(double, "100Mi", shim=True, limits=limits)
    try:
        _in_pod(proc_dir, within.pid)
        _in_pod(proc_dir, shimmed.pid)
        audit = SliceAudit(
            backend,
            lambda: [_container()],
            SliceAuditSettings(proc_dir=proc_dir, tolerance_bytes=0),
        )
        assert audit.run_once() == []
        # Another pod's process, and one in no pod at all, are not this pod's memory.
        stranger = _allocating(double, "4Gi", shim=False, limits=limits)
        try:
            _in_pod(proc_dir, stranger.pid, uid="99999999-1111-2222-3333-444455556666")
            assert audit.run_once() == []
        finally:
            _stop(stranger)
    finally:
        _stop(within, shimmed)


def test_kill_when_asked_stops_the_offending_processes(
    backend: PynvmlBackend, double: NvmlDouble, tmp_path: Path
) -> None:
    limits = tmp_path / "limits"
    limits.write_bytes(encode_limits(_container().limits))  # type: ignore[arg-type]
    proc_dir = tmp_path / "proc"
    escaped = _allocating(double, "3Gi", shim=False, limits=limits)
    try:
        _in_pod(proc_dir, escaped.pid)
        settings = SliceAuditSettings(proc_dir=proc_dir, kill=True)
        audit = SliceAudit(backend, lambda: [_container()], settings)
        assert len(audit.run_once()) == 1
        assert escaped.wait(timeout=10) == -signal.SIGKILL
        assert _samples(audit)["fracgpu_slice_bypass_kills_total"] == 1
    finally:
        _stop(escaped)


def test_tolerance_and_gpus_outside_the_limits() -> None:
    pod_of = {1: POD_UID, 2: POD_UID}.get
    usage = [(GPU, 1, GIB + 100), (GPU, 2, 100)]
    assert find_overruns(usage, pod_of, [_container()], tolerance_bytes=100) == []
    (over,) = find_overruns(usage, pod_of, [_container()], tolerance_bytes=0)
    assert over.used_bytes == GIB + 200
    # memory on a GPU the pod was not given is all past its slice
    other = "GPU-fa4e0000-0000-4000-8000-0000000000ff"
    (elsewhere,) = find_overruns([(other, 1, 1)], pod_of, [_container()], tolerance_bytes=0)
    assert elsewhere.slice_bytes == 0


MIB = 1 << 20


def test_idle_processes_do_not_raise_the_bound_for_a_bypass() -> None:
    """The attack: fill the slice with idle shimmed processes, each a context the slice
    counts (500 MiB here), then hold memory in one process that bypasses the shim. With a
    flat 512 MiB per process the 40 idle ones tolerated 20 GiB more; a process is now
    tolerated only what it holds beyond its counted context."""
    slice_bytes = 20 * GIB
    pids = range(1, 42)
    pod_of = dict.fromkeys(pids, POD_UID).get
    idle = [(GPU, pid, 500 * MIB) for pid in pids[:40]]
    bypass = [(GPU, 41, 10 * GIB)]
    container = _container(slice_bytes, counted_context=500 * MIB)
    (over,) = find_overruns(idle + bypass, pod_of, [container], 512 * MIB)
    assert over.used_bytes == 40 * 500 * MIB + 10 * GIB and over.pids == tuple(pids)
    # The idle processes alone are within the slice.
    assert find_overruns(idle, pod_of, [container], 512 * MIB) == []


def test_a_pod_whose_processes_load_code_the_slice_cannot_see_is_not_reported() -> None:
    """Each process: a counted context (500 MiB), counted allocations filling the slice,
    and 300 MiB of module code and statics the shim cannot count, within the tolerance."""
    pod_of = dict.fromkeys(range(1, 5), POD_UID).get
    counted = 500 * MIB
    allocations = (8 * GIB - 4 * counted) // 4
    usage = [(GPU, pid, counted + allocations + 300 * MIB) for pid in range(1, 5)]
    pod = [_container(8 * GIB, counted_context=counted)]
    assert find_overruns(usage, pod_of, pod, 512 * MIB) == []
    # Past the tolerance, it is.
    heavier = [(GPU, pid, counted + allocations + 600 * MIB) for pid in range(1, 5)]
    assert find_overruns(heavier, pod_of, pod, 512 * MIB)


def test_the_counted_context_is_the_pods_own_not_the_agents_latest() -> None:
    """A pod started while contexts were not counted (its limits say 0) keeps its whole
    tolerance per process after the agent restarts and measures a context: its shims never
    counted one, so nothing of what its processes hold is tolerated twice."""
    pod_of = dict.fromkeys(range(1, 5), POD_UID).get
    usage = [(GPU, 1, 3584 * MIB + 300 * MIB)] + [(GPU, pid, 300 * MIB) for pid in (2, 3, 4)]
    started_uncounted = [_container(4 * GIB, counted_context=0)]
    assert find_overruns(usage, pod_of, started_uncounted, 512 * MIB) == []


def test_hostile_cgroup_files_are_bounded(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_bytes(b"\xff" * (1 << 20) + POD_UID.encode())
    assert pod_uid_of(tmp_path, 7) is None  # only the first 64 KiB is read
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "cgroup").symlink_to(tmp_path / "7" / "cgroup")
    assert pod_uid_of(tmp_path, 8) is None  # a link is not followed
    assert pod_uid_of(tmp_path, 9) is None  # gone
    with pytest.raises(ValueError, match="tolerance"):
        SliceAuditSettings(tolerance_bytes=-1)


@pytest.fixture
def kubelet(short_dir: Path) -> Iterator[TestKubelet]:
    k = TestKubelet(short_dir / "dp", short_dir / "pr.sock")
    k.start()
    yield k
    k.close()


def _metric(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
    return None


def test_the_running_agent_exports_a_pod_over_its_slice(
    double: NvmlDouble, kubelet: TestKubelet, short_dir: Path, tmp_path: Path
) -> None:
    proc_dir = tmp_path / "proc"
    proc_dir.mkdir()
    agent = AgentProcess(
        node="node-a",
        directory=short_dir,
        double=double,
        kubeconfig=write_unused_kubeconfig(short_dir / "kubeconfig"),
        publish_inventory=False,
        extra=("--slice-audit-seconds=0.2", f"--slice-audit-proc-dir={proc_dir}"),
    )
    escaped: subprocess.Popen[str] | None = None
    try:
        port = agent.metrics_port()
        kubelet.wait_for_plugin(RESOURCE_VCUDA_CORE, timeout=30)
        # A container kubelet lists with our device IDs, and the limits file the agent
        # wrote for it at start (written here directly: no API server in this test).
        ids = [f"{GPU}-core-{i}" for i in range(50)]
        limits_text = encode_limits(_container().limits).decode()  # type: ignore[arg-type]
        AllocationFiles(agent.state_dir).write_limits(
            allocation_key(RESOURCE_VCUDA_CORE, ids), limits_text
        )
        with kubelet.lock:
            kubelet.allocations[
                (ContainerRef("team-a", "trainer", "main"), RESOURCE_VCUDA_CORE)
            ] = ids
        limits = tmp_path / "limits"
        limits.write_text(limits_text)
        escaped = _allocating(double, "3Gi", shim=False, limits=limits)  # its slice: 1 GiB
        _in_pod(proc_dir, escaped.pid)
        name = f'fracgpu_pod_memory_over_slice_bytes{{gpu="{GPU.lower()}"'
        deadline = time.monotonic() + 20
        while (over := _metric(port, name)) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert over == 2 * GIB
        assert escaped.poll() is None  # killing is off unless asked for
        assert any(
            e.get("level") == "error"
            and e.get("pod") == "trainer"
            and "outside the shim" in e["msg"]
            for e in agent.logs
        )
    finally:
        if escaped is not None:
            _stop(escaped)
        assert agent.stop() == 0


def test_slice_audit_settings_are_validated() -> None:
    s = parse_settings(["--node-name=n"], env={})
    assert (s.slice_audit_kill, s.slice_audit_tolerance_bytes) == (False, 512 << 20)
    on = parse_settings(["--node-name=n", "--slice-audit-kill"], env={})
    assert on.slice_audit_kill is True
    env = {"FRACGPU_AGENT_SLICE_AUDIT_KILL": "true"}
    assert parse_settings(["--node-name=n"], env=env).slice_audit_kill is True
    # Host PIDs are signalled only from the host's PID namespace.
    with pytest.raises(SettingsError, match="hostPID"):
        parse_settings(["--node-name=n", "--slice-audit-kill", "--slice-audit-proc-dir=/h"], env={})
    for bad, says in (
        ("--slice-audit-seconds=0", "greater than 0"),
        ("--slice-audit-kill=maybe", "true or false"),
        ("--slice-audit-tolerance-bytes=-1", "0 to"),
        (f"--slice-audit-tolerance-bytes={8 << 30}", "0 to"),
    ):
        with pytest.raises(SettingsError, match=says):
            parse_settings(["--node-name=n", bad], env={})


def test_a_pid_now_of_another_pod_is_not_killed(tmp_path: Path) -> None:
    """The PIDs come from NVML a moment before the kill: one whose process ended and whose
    number another pod's process took must not be killed for the first pod's overrun."""
    proc_dir = tmp_path / "proc"
    other_pod = "0e6f1c2a-9999-2222-3333-444455556666"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        _in_pod(proc_dir, sleeper.pid, uid=other_pod)
        assert kill_if_in_pod(proc_dir, sleeper.pid, POD_UID) is False
        assert sleeper.poll() is None
        assert kill_if_in_pod(proc_dir, sleeper.pid, other_pod) is True
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert kill_if_in_pod(proc_dir, sleeper.pid, other_pod) is False  # gone: nothing sent
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait()
