"""GPU health: critical XID events and failing NVML queries make a GPU unhealthy.

Two background threads feed one state table:
- the XID thread blocks in NVML's event-set wait and records critical XIDs (every XID
  except the application-caused ones in ``ignored_xids``, see docs/agent.md);
- the probe thread queries every GPU each ``probe_seconds``: an NVML error marks the GPU
  unhealthy, a successful query clears that again, and an XID older than
  ``xid_recovery_seconds`` with the GPU answering counts as recovered.
Listeners get the whole health map whenever any GPU's health changes.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.nvml_backend import NvmlBackend, NvmlError

log = logging.getLogger(__name__)

HealthListener = Callable[[dict[str, bool]], None]
_XID_WAIT_MS = 500


@dataclass
class _GpuState:
    nvml_error: str | None = None
    xid: int | None = None
    xid_at: float = 0.0

    @property
    def healthy(self) -> bool:
        return self.nvml_error is None and self.xid is None


class HealthMonitor:
    def __init__(
        self,
        backend: NvmlBackend,
        uuids: Iterable[str],
        *,
        probe_seconds: float,
        xid_recovery_seconds: float,
        ignored_xids: Iterable[int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._probe_seconds = probe_seconds
        self._recovery = xid_recovery_seconds
        self._ignored = frozenset(ignored_xids)
        self._clock = clock
        self._lock = threading.Lock()
        self._states = {uuid: _GpuState() for uuid in uuids}
        self._listeners: list[HealthListener] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Set once XID events are being received (tests and logs wait on it).
        self.xid_watch_ready = threading.Event()

    # -- queries ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, bool]:
        with self._lock:
            return {uuid: state.healthy for uuid, state in self._states.items()}

    def reasons(self) -> dict[str, str]:
        """Why each unhealthy GPU is unhealthy (for logs and the inventory)."""
        with self._lock:
            out = {}
            for uuid, state in self._states.items():
                if state.nvml_error is not None:
                    out[uuid] = state.nvml_error
                elif state.xid is not None:
                    out[uuid] = f"critical XID {state.xid}"
            return out

    def add_listener(self, listener: HealthListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    # -- state changes ---------------------------------------------------------------------
    def _update(self, change: Callable[[], None]) -> None:
        with self._lock:
            before = {uuid: s.healthy for uuid, s in self._states.items()}
            change()
            after = {uuid: s.healthy for uuid, s in self._states.items()}
            listeners = list(self._listeners)
        if before == after:
            return
        reasons = self.reasons()
        for uuid, healthy in after.items():
            if before[uuid] != healthy:
                log.warning(
                    "GPU health changed",
                    extra={"gpu": uuid, "healthy": healthy, "reason": reasons.get(uuid)},
                )
        for listener in listeners:
            try:
                listener(dict(after))
            except Exception:
                log.exception("health listener failed")

    def record_xid(self, uuid: str, xid: int) -> None:
        if xid in self._ignored:
            log.info("application XID ignored", extra={"gpu": uuid, "xid": xid})
            return
        if uuid not in self._states:
            log.warning("XID for an unknown GPU", extra={"gpu": uuid, "xid": xid})
            return

        def mark() -> None:
            state = self._states[uuid]
            state.xid = xid
            state.xid_at = self._clock()

        self._update(mark)

    def probe_once(self) -> None:
        """Query every GPU now; mark failures and recoveries."""
        results: dict[str, str | None] = {}
        for uuid in list(self._states):
            try:
                self._backend.probe(uuid)
                results[uuid] = None
            except NvmlError as error:
                results[uuid] = str(error)
        now = self._clock()

        def apply() -> None:
            for uuid, error in results.items():
                state = self._states[uuid]
                state.nvml_error = error
                if error is None and state.xid is not None and now - state.xid_at >= self._recovery:
                    state.xid = None

        self._update(apply)

    # -- threads ---------------------------------------------------------------------------
    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self._xid_loop, name="health-xid", daemon=True),
            threading.Thread(target=self._probe_loop, name="health-probe", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def _probe_loop(self) -> None:
        while not self._stop.is_set():
            self.probe_once()
            self._stop.wait(self._probe_seconds)

    def _xid_loop(self) -> None:
        try:
            self._backend.watch_xids(list(self._states))
        except NvmlError as error:
            # Some GPUs (and vGPUs) cannot deliver events; the probes still cover them.
            log.warning("XID events unavailable; relying on probes", extra={"error": str(error)})
            return
        self.xid_watch_ready.set()
        while not self._stop.is_set():
            try:
                event = self._backend.wait_xid(_XID_WAIT_MS)
            except NvmlError as error:
                log.warning("XID wait failed", extra={"error": str(error)})
                self._stop.wait(self._probe_seconds)
                continue
            if event is not None:
                self.record_xid(event.uuid, event.xid)
