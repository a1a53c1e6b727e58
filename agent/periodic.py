"""A piece of the agent's work run again and again on a thread of its own."""

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    """Runs ``work`` every ``interval_seconds`` until stopped. A failure of one run (kubelet
    or NVML away for a while) is logged as ``skipped`` and the next run comes as usual."""

    def __init__(
        self,
        name: str,
        work: Callable[[], object],
        interval_seconds: float,
        *,
        skipped: str,
        errors: tuple[type[BaseException], ...] = (Exception,),
    ) -> None:
        self._work = work
        self._interval = interval_seconds
        self._skipped = skipped
        self._errors = errors
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> bool:
        """Stop and wait for the thread; whether it has ended."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=10)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._work()
            except self._errors as error:
                log.warning(self._skipped, extra={"error": str(error)})
            self._stop.wait(self._interval)
