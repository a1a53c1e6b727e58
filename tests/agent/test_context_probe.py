"""The agent's measurement of what one CUDA context takes (``--context-overhead-bytes=auto``).

A real child process retains a primary context through the libcuda test double, which
charges ``context_bytes`` to that PID in the simulated hardware; the NVML double reports it
through nvmlDeviceGetComputeRunningProcesses, as the driver does. A stand-in for the host's
/proc checks how the child's host PID is found from another PID namespace.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.context_probe import ProbeError, host_pids_of, measure_gpu, measure_node
from agent.nvml_backend import PynvmlBackend
from tests.agent.nvml_double import NvmlDouble, double_in_this_process

MIB = 1 << 20
GPU_A = "GPU-fa4e0000-0000-4000-8000-0000000000c0"
GPU_B = "GPU-fa4e0000-0000-4000-8000-0000000000c1"
CONTEXT = 300 * MIB


@pytest.fixture(scope="module")
def state_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The NVML double maps its simulated hardware once per process: share it in the module.
    return tmp_path_factory.mktemp("ctx") / "gpu.state"


@pytest.fixture
def double(short_dir: Path, state_file: Path, monkeypatch: pytest.MonkeyPatch) -> NvmlDouble:
    return double_in_this_process(
        short_dir,
        monkeypatch,
        state_file=str(state_file),
        device_count=2,
        device__0__uuid=GPU_A,
        device__1__uuid=GPU_B,
        context_bytes=CONTEXT,
    )


def test_a_context_is_measured_from_the_drivers_count_and_given_back(
    backend: PynvmlBackend,
) -> None:
    assert measure_gpu(GPU_A, backend) == CONTEXT
    # The child has released its context and exited: nothing of it stays on the GPU.
    assert backend.compute_processes(GPU_A) == []


def test_each_model_is_measured_once_and_a_refusing_gpu_gives_way_to_another(
    backend: PynvmlBackend,
) -> None:
    missing = "GPU-fa4e0000-0000-4000-8000-0000000000cf"
    measured = measure_node(
        [(missing, "A100"), (GPU_A, "A100"), (GPU_B, "A100")], backend, limit_bytes=1 << 30
    )
    assert measured.bytes == CONTEXT
    assert dict(measured.by_model) == {"A100": CONTEXT}
    assert list(measured.failures) == [missing]
    assert f"none of the 2 CUDA devices has UUID {missing}" in measured.failures[missing]


def test_a_context_past_the_bound_is_not_used(backend: PynvmlBackend) -> None:
    measured = measure_node([(GPU_A, "A100")], backend, limit_bytes=CONTEXT - 1)
    assert measured.bytes == 0 and not measured.by_model
    assert (
        f"a context took {CONTEXT} bytes, more than the {CONTEXT - 1}" in (measured.failures[GPU_A])
    )


def test_without_the_compute_library_the_reason_is_given(
    backend: PynvmlBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = subprocess.run(["ldconfig", "-p"], check=False, capture_output=True, text=True)
    if "libcuda.so.1 " in system.stdout:
        pytest.skip("this machine has a system libcuda, which the child would find")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))  # no libcuda.so.1 there
    with pytest.raises(ProbeError, match=r"cannot load libcuda\.so\.1 .*compute"):
        measure_gpu(GPU_A, backend)


def test_a_child_that_never_answers_is_stopped_at_the_timeout(backend: PynvmlBackend) -> None:
    silent = (sys.executable, "-c", "import time; time.sleep(60)")
    started = time.monotonic()
    with pytest.raises(ProbeError, match=r"no answer within 0\.5 s"):
        measure_gpu(GPU_A, backend, timeout_seconds=0.5, child_command=silent)
    assert time.monotonic() - started < 15


def test_a_child_whose_host_pid_cannot_be_found_is_not_guessed(
    backend: PynvmlBackend, tmp_path: Path
) -> None:
    with pytest.raises(ProbeError, match="run the agent with hostPID"):
        measure_gpu(GPU_A, backend, proc_dir=tmp_path)  # a host /proc without the child


def _fake_entry(proc: Path, pid: int, stat: str, nspid: str) -> None:
    entry = proc / str(pid)
    entry.mkdir()
    (entry / "stat").write_text(stat)
    (entry / "status").write_text(f"Name:\tpython\nNSpid:\t{nspid}\n")


def test_the_host_pid_is_the_entry_with_the_same_inner_pid_and_start_time(tmp_path: Path) -> None:
    pid = os.getpid()
    stat = Path(f"/proc/{pid}/stat").read_text()
    name, rest = stat.rsplit(")", 1)
    fields = rest.split()
    fields[19] = str(int(fields[19]) + 1)
    restarted = f"{name}) {' '.join(fields)}\n"
    _fake_entry(tmp_path, 9001, restarted, f"9001\t{pid}")  # same inner PID, later start
    _fake_entry(tmp_path, 9002, stat, f"9002\t{pid + 1}")  # same start, another process
    _fake_entry(tmp_path, 9003, stat, f"9003\t{pid}")  # this process, seen from the host
    assert host_pids_of(tmp_path, pid) == [9003]
    assert host_pids_of(Path("/proc"), pid) == [pid]  # the same namespace (hostPID)
    (tmp_path / "9003" / "status").write_text("Name:\tpython\n")  # no NSpid: not matched
    assert host_pids_of(tmp_path, pid) == []


def test_a_workload_process_posing_as_the_probe_stops_the_measurement(
    backend: PynvmlBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: a process in another PID namespace with the probe's number, started in the
    same clock tick, so that the figure would be read from a process the workload controls
    (a tiny one counts contexts as nothing). Two candidates: the GPU is not measured."""
    real = host_pids_of

    def with_a_twin(proc_dir: Path, pid: int) -> list[int]:
        stat = Path(f"/proc/{pid}/stat").read_text()
        for host_pid in (7001, 7002):  # the probe and its twin, as a host /proc shows them
            _fake_entry(proc_dir, host_pid, stat, f"{host_pid}\t{pid}")
        return real(proc_dir, pid)

    monkeypatch.setattr("agent.context_probe.host_pids_of", with_a_twin)
    with pytest.raises(ProbeError, match=r"matches host PIDs \[7001, 7002\]"):
        measure_gpu(GPU_A, backend, proc_dir=tmp_path)
