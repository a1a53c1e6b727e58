"""Memory taken past a slice where the shim cannot see it, caught from NVML's side.

The shim covers every way a process can reach the CUDA driver through the dynamic
loader. What it cannot cover in-process - a statically linked or privately loaded copy
of the driver, raw ioctls on /dev/nvidia*, code that finds driver functions without the
loader - still shows in the driver's own per-process accounting
(nvmlDeviceGetComputeRunningProcesses). This module sums that accounting per pod and
GPU, using each PID's cgroup (which names its pod's UID) and compares it with the sum of
the slices the pod's containers were given on that GPU (their limits files). A pod over
its slices by more than a per-process tolerance (driver context memory the slice does
not count) is reported: a log line, the metrics below, and - only when the setting asks
for it - SIGKILL for that pod's processes on that GPU.

Reading another container's PIDs needs the host's /proc (the agent's pod with hostPID,
or the host's /proc mounted read-only and named by ``proc_dir``); without it PIDs do
not resolve and nothing is reported (the check is then blind, never wrong).
"""

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.containers import LiveContainer
from agent.procfs import read_proc_file

log = logging.getLogger(__name__)

# Kubelet's cgroup names carry the pod UID ("pod<uid>", dashes or, with the systemd
# driver, underscores).
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
_CGROUP_FILE_CAP = 64 * 1024
# Per process on a GPU: the driver's context memory, which the slice does not count. A
# context takes a few hundred MiB; more than the cap would hide a real bypass.
DEFAULT_TOLERANCE_BYTES = 512 << 20
MAX_TOLERANCE_BYTES = 4 << 30
# A pod's detection count outlives the pod this long, so that scrapes (30 s apart by
# default) see a short-lived pod caught, or one the kill ended; then it goes with it.
DETECTIONS_KEPT_SECONDS = 600.0


class ProcessSource(Protocol):
    def compute_processes(self, uuid: str) -> list[tuple[int, int]]: ...


@dataclass(frozen=True)
class SliceAuditSettings:
    """How the check runs; validated here, once."""

    proc_dir: Path = Path("/proc")
    tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES
    kill: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance_bytes <= MAX_TOLERANCE_BYTES:
            raise ValueError(
                f"slice audit tolerance {self.tolerance_bytes} is not allowed: "
                f"use 0 to {MAX_TOLERANCE_BYTES} bytes"
            )


@dataclass(frozen=True)
class Overrun:
    namespace: str
    pod: str
    pod_uid: str
    gpu: str
    used_bytes: int
    slice_bytes: int
    pids: tuple[int, ...]


def pod_uid_of(proc_dir: Path, pid: int) -> str | None:
    """The pod UID in a process's cgroup path, or None (not a pod's, gone, unreadable)."""
    text = read_proc_file(proc_dir / str(pid) / "cgroup", _CGROUP_FILE_CAP)
    if text is None:
        return None
    match = _POD_UID.search(text)
    return match.group(1).replace("_", "-") if match else None


def kill_if_in_pod(proc_dir: Path, pid: int, pod_uid: str) -> bool:
    """SIGKILL ``pid`` if it still is a process of pod ``pod_uid``; whether it was sent.

    The PID was read a moment ago: the process may have ended and its number gone to
    another pod's. A pidfd pins the process first, then its cgroup is read again; a
    process that ends after that takes the pidfd with it, and the signal goes nowhere."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if pod_uid_of(proc_dir, pid) != pod_uid:
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def find_overruns(
    usage: Iterable[tuple[str, int, int]],
    pod_of: Callable[[int], str | None],
    containers: Iterable[LiveContainer],
    tolerance_bytes: int,
) -> list[Overrun]:
    """usage: (gpu uuid, pid, used bytes) from NVML. Pods over their slices on a GPU.

    Each process is tolerated what it holds beyond the context its slice already counts
    (the pod's limits files say how much: what the agent measured when the pod started),
    up to ``tolerance_bytes`` (driver memory the shim cannot see: module code, statics).
    A flat tolerance per process let a pod raise its own bound by starting idle processes,
    whose counted contexts were then tolerated a second time."""
    slices: dict[tuple[str, str], int] = {}
    names: dict[str, tuple[str, str]] = {}
    counted: dict[str, int] = {}  # pod uid -> what its shims count per context
    for c in containers:
        if c.limits is None or c.limits.whole or not c.limits.pod_uid:
            continue
        names[c.limits.pod_uid] = (c.namespace, c.pod)
        counted[c.limits.pod_uid] = max(
            counted.get(c.limits.pod_uid, 0), c.limits.context_overhead_bytes
        )
        for device in c.limits.devices:
            key = (c.limits.pod_uid, device.uuid.lower())
            slices[key] = slices.get(key, 0) + device.memory_limit_bytes
    used: dict[tuple[str, str], tuple[int, int, list[int]]] = {}
    for gpu, pid, nbytes in usage:
        uid = pod_of(pid)
        if uid is None or uid not in names:
            continue  # not a sliced fracgpu pod: whole GPUs and host processes are not ours
        total, tolerated, pids = used.get((uid, gpu.lower()), (0, 0, []))
        held = max(nbytes, 0)
        tolerance = min(tolerance_bytes, max(0, held - counted[uid]))
        used[(uid, gpu.lower())] = (total + held, tolerated + tolerance, [*pids, pid])
    out = []
    for (uid, gpu), (total, tolerated, pids) in sorted(used.items()):
        allowed = slices.get((uid, gpu), 0)  # a GPU not in its limits: nothing allowed
        if total > allowed + tolerated:
            namespace, pod = names[uid]
            out.append(Overrun(namespace, pod, uid, gpu, total, allowed, tuple(sorted(pids))))
    return out


@dataclass(eq=False)
class SliceAudit:
    """Run ``run_once`` periodically; register the instance as a Prometheus collector."""

    source: ProcessSource
    containers: Callable[[], list[LiveContainer]]
    settings: SliceAuditSettings = field(default_factory=SliceAuditSettings)
    killer: Callable[[Path, int, str], bool] = kill_if_in_pod
    clock: Callable[[], float] = time.monotonic
    _current: list[Overrun] = field(default_factory=list)
    _detections: dict[tuple[str, str, str], int] = field(default_factory=dict)
    _gone_since: dict[tuple[str, str], float] = field(default_factory=dict)
    _kills: int = 0
    # run_once (the audit loop's thread) and collect (a scrape's thread) meet here.
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run_once(self) -> list[Overrun]:
        live = self.containers()
        gpus = sorted(
            {
                d.uuid
                for c in live
                if c.limits is not None and not c.limits.whole
                for d in c.limits.devices
            }
        )
        usage: list[tuple[str, int, int]] = []
        for gpu in gpus:
            try:
                usage += [(gpu, pid, used) for pid, used in self.source.compute_processes(gpu)]
            except Exception as error:  # one GPU failing must not blind the others
                log.warning(
                    "per-process GPU memory unavailable", extra={"gpu": gpu, "error": str(error)}
                )
        found = find_overruns(
            usage,
            lambda pid: pod_uid_of(self.settings.proc_dir, pid),
            live,
            self.settings.tolerance_bytes,
        )
        for o in found:
            key = (o.namespace, o.pod, o.gpu)
            with self._lock:
                self._detections[key] = self._detections.get(key, 0) + 1
            log.error(
                "GPU memory past the slice outside the shim (a private driver copy or raw "
                "ioctls): pod %s/%s uses %d bytes on %s, its slices allow %d",
                o.namespace, o.pod, o.used_bytes, o.gpu, o.slice_bytes,
                extra={"namespace": o.namespace, "pod": o.pod, "gpu": o.gpu, "pids": list(o.pids),
                       "killed": self.settings.kill},
            )  # fmt: skip
            if self.settings.kill:
                for pid in o.pids:
                    try:
                        if self.killer(self.settings.proc_dir, pid, o.pod_uid):
                            with self._lock:
                                self._kills += 1
                    except OSError as error:
                        log.warning("cannot kill", extra={"pid": pid, "error": str(error)})
        with self._lock:
            self._current = found
            # Counts of pods gone for a while go with them: one series per pod ever caught
            # would grow without end on a long-lived node.
            here = {(c.namespace, c.pod) for c in live}
            now = self.clock()
            for pod in {(k[0], k[1]) for k in self._detections} - here:
                since = self._gone_since.setdefault(pod, now)
                if now - since >= DETECTIONS_KEPT_SECONDS:
                    for key in [k for k in self._detections if (k[0], k[1]) == pod]:
                        del self._detections[key]
                    del self._gone_since[pod]
            for pod in here & self._gone_since.keys():
                del self._gone_since[pod]
        return found

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            current = list(self._current)
            detected = sorted(self._detections.items())
            killed = self._kills
        over = GaugeMetricFamily(
            "fracgpu_pod_memory_over_slice_bytes",
            "GPU memory a pod holds past its slices by the driver's per-process accounting",
            labels=["namespace", "pod", "gpu"],
        )
        for o in current:
            over.add_metric([o.namespace, o.pod, o.gpu], o.used_bytes - o.slice_bytes)
        detections = CounterMetricFamily(
            "fracgpu_slice_bypass_detections",
            "Checks that found a pod past its slices outside the shim",
            labels=["namespace", "pod", "gpu"],
        )
        for (namespace, pod, gpu), n in detected:
            detections.add_metric([namespace, pod, gpu], n)
        kills = CounterMetricFamily(
            "fracgpu_slice_bypass_kills", "Processes killed for holding memory past a slice"
        )
        kills.add_metric([], killed)
        yield over
        yield detections
        yield kills
