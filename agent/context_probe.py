"""What one CUDA context takes on this node's GPUs, measured once at start-up.

Every process's primary context, and each context it creates, takes device memory for the
driver's own use outside any allocation call. The shim counts a fixed amount per context
against the slice (``--context-overhead-bytes``); with ``auto`` the agent measures it here:
a child process (``agent.cuda_context_child``) retains one GPU's primary context, and
NVML's per-process accounting (``nvmlDeviceGetComputeRunningProcesses``, the driver's own
count, which nothing in a container can change) says what that PID holds. One GPU of each
model is measured (another of the same model if one refuses, e.g. a GPU in exclusive
compute mode that a workload holds); the node uses the largest figure.

NVML reports host PIDs. The child's host PID is found in the host's /proc (``proc_dir``, as
the slice audit reads it; the agent's own /proc with hostPID) as the one process whose
innermost PID (``NSpid``) and start time match the child's. A workload could start a
process with the same number in its own PID namespace in the same clock tick; then the
match is not unique and that GPU is not measured, rather than measured from a process the
workload controls.
"""

import logging
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.procfs import read_proc_file
from agent.slice_audit import ProcessSource

log = logging.getLogger(__name__)

# How long the child may take to make its context (cuInit on a large node takes seconds).
DEFAULT_TIMEOUT_SECONDS = 60.0
# How long NVML may take to list the child once its context exists.
_LISTED_WITHIN_SECONDS = 2.0
_LISTED_POLL_SECONDS = 0.05
_PROC_FILE_CAP = 4096
_CHILD_LINE_CAP = 4096
# The child, given the GPU's UUID as its last argument.
CHILD_COMMAND = (sys.executable, "-m", "agent.cuda_context_child")


class ProbeError(Exception):
    """One GPU could not be measured; the message says why."""


@dataclass(frozen=True)
class ContextMeasurement:
    """The node's figure, and what each GPU model measured or why it could not be."""

    bytes: int
    by_model: Mapping[str, int]
    failures: Mapping[str, str]  # GPU UUID -> reason


def measure_node(
    gpus: Iterable[tuple[str, str]],
    processes: ProcessSource,
    *,
    proc_dir: Path = Path("/proc"),
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    limit_bytes: int,
) -> ContextMeasurement:
    """Measure a context on one GPU of each model (``gpus``: (uuid, model) pairs); the node's
    figure is the largest, at most ``limit_bytes`` (larger is reported as a failure)."""
    by_model: dict[str, int] = {}
    failures: dict[str, str] = {}
    for uuid, model in gpus:
        if model in by_model:
            continue
        try:
            taken = measure_gpu(uuid, processes, proc_dir=proc_dir, timeout_seconds=timeout_seconds)
        except ProbeError as error:
            failures[uuid] = str(error)
            continue
        if taken > limit_bytes:
            failures[uuid] = (
                f"a context took {taken} bytes, more than the {limit_bytes} a context may be "
                "counted for"
            )
            continue
        by_model[model] = taken
    return ContextMeasurement(max(by_model.values(), default=0), by_model, failures)


def measure_gpu(
    uuid: str,
    processes: ProcessSource,
    *,
    proc_dir: Path = Path("/proc"),
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    child_command: Sequence[str] = CHILD_COMMAND,
) -> int:
    """Device memory NVML charges a process that holds only ``uuid``'s primary context."""
    child = subprocess.Popen(
        [*child_command, uuid],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=_child_env(),
    )
    try:
        line = _read_line(child, timeout_seconds)
        if line != "ready":
            reason = line.removeprefix("error: ") if line else "it exited without a word"
            raise ProbeError(f"the context probe on {uuid} failed: {reason}")
        found = host_pids_of(proc_dir, child.pid)
        if not found:
            raise ProbeError(
                f"the context probe's PID {child.pid} is not in {proc_dir}: run the agent with "
                "hostPID or give it the host's /proc (--slice-audit-proc-dir)"
            )
        if len(found) > 1:
            # A process elsewhere posing as the probe would set the figure: measure another.
            raise ProbeError(
                f"the context probe's PID {child.pid} matches host PIDs {sorted(found)}: "
                "another process has its number and start time"
            )
        return _listed_bytes(processes, uuid, found[0])
    finally:
        _finish(child)


def _child_env() -> dict[str, str]:
    # No preload reaches the probe: it measures the driver, not a slice.
    return {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "CUDA_VISIBLE_DEVICES")}


def _read_line(child: subprocess.Popen[bytes], timeout_seconds: float) -> str:
    """The child's first line of output, bounded in size and time ('' if it gave none)."""
    assert child.stdout is not None
    deadline = time.monotonic() + timeout_seconds
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        while b"\n" not in buffer and len(buffer) < _CHILD_LINE_CAP:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise ProbeError(f"the context probe gave no answer within {timeout_seconds:g} s")
            chunk = os.read(child.stdout.fileno(), _CHILD_LINE_CAP)
            if not chunk:
                break
            buffer += chunk
    return buffer.split(b"\n", 1)[0].decode(errors="replace").strip()


def _listed_bytes(processes: ProcessSource, uuid: str, host_pid: int) -> int:
    deadline = time.monotonic() + _LISTED_WITHIN_SECONDS
    while True:
        for pid, used in processes.compute_processes(uuid):
            if pid == host_pid and used > 0:
                return used
        if time.monotonic() >= deadline:
            raise ProbeError(
                f"NVML lists no memory for the context probe (host PID {host_pid}) on {uuid}"
            )
        time.sleep(_LISTED_POLL_SECONDS)


def _finish(child: subprocess.Popen[bytes]) -> None:
    """Let the child release its context and exit; kill it if it does not within 10 s."""
    try:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        child.kill()
        child.wait()
    finally:
        if child.stdout is not None:
            child.stdout.close()


def host_pids_of(proc_dir: Path, pid: int) -> list[int]:
    """The PIDs in ``proc_dir``'s namespace that may be this namespace's process ``pid``:
    entries whose innermost PID is ``pid`` and whose start time is that process's. More
    than one means another namespace has a process of that number started in the same
    clock tick, and the caller must not guess."""
    started = _start_time(Path("/proc") / str(pid))
    if started is None:
        return []
    try:
        entries = [e.name for e in os.scandir(proc_dir) if e.name.isdigit()]
    except OSError:
        return []
    return [
        int(name)
        for name in entries
        if _innermost_pid(proc_dir / name) == pid and _start_time(proc_dir / name) == started
    ]


def _start_time(entry: Path) -> int | None:
    """Field 22 of ``stat``: the process's start, in clock ticks after boot (the same seen
    from every PID namespace)."""
    text = read_proc_file(entry / "stat", _PROC_FILE_CAP)
    if text is None or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    try:
        return int(fields[19])  # fields after the name start at field 3
    except (IndexError, ValueError):
        return None


def _innermost_pid(entry: Path) -> int | None:
    """The last PID of ``status``'s NSpid line: the process's PID in its own namespace."""
    text = read_proc_file(entry / "status", _PROC_FILE_CAP)
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            parts = line.split()[1:]
            return int(parts[-1]) if parts and parts[-1].isdigit() else None
    return None
