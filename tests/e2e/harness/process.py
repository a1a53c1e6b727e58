"""A child process in its own process group, logging to a file, stopped without leftovers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO


class ProcessFailedError(RuntimeError):
    """A control-plane process exited or never became ready."""


class ManagedProcess:
    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str]
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._env = dict(env)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.running():
            raise ProcessFailedError(f"{self.name} is already running (pid {self.pid})")
        self._close_log()
        self._log = self.log_path.open("ab")
        self._log.write(f"\n=== start {time.strftime('%H:%M:%S')}: {self.argv}\n".encode())
        self._log.flush()
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self._env,
            # Own process group: stop() can signal everything the binary forked.
            start_new_session=True,
        )

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; waits until the process is reaped."""
        self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL at once, as a crash would."""
        self._signal_and_wait(signal.SIGKILL, 0.0)

    def _signal_and_wait(self, sig: signal.Signals, timeout: float) -> None:
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                self._signal_group(proc.pid, sig)
                try:
                    proc.wait(timeout=timeout if timeout > 0 else 10.0)
                except subprocess.TimeoutExpired:
                    self._signal_group(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10.0)
            # Children in the group (none expected) must not outlive the leader.
            self._signal_group(proc.pid, signal.SIGKILL)
        self._close_log()

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `ready` until true; fail early, with the log tail, if the process dies."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            if not self.running():
                code = self._proc.returncode if self._proc is not None else None
                raise ProcessFailedError(
                    f"{self.name} exited (code {code}) before {what}; log {self.log_path}:\n"
                    f"{self.log_tail()}"
                )
            if ready():
                return
            if time.monotonic() > deadline:
                raise ProcessFailedError(
                    f"{self.name} not {what} after {timeout:.0f}s; log {self.log_path}:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
