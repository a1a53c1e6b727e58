"""Run one program as a child and stand in for it: its exit code, and signals passed on.

A signal someone sends this process (``kill``, a service manager) is sent on to the child.
A signal the terminal sends (Ctrl-C, Ctrl-\\) already reaches the child, which is in the
same foreground process group, so it is not sent twice: the kernel marks those with
``SI_KERNEL``, a sender process with ``SI_USER``/``SI_QUEUE``/``SI_TKILL`` (≤ 0).
"""

import contextlib
import os
import signal
from collections.abc import Mapping, Sequence

FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)
# Exit codes of a shell for a program it cannot run.
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
_SIGNAL_EXIT_BASE = 128


class SpawnError(Exception):
    """The program could not be started; carries the shell's exit code for it."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def run_child(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Start ``argv`` (looked up on PATH) with ``env``, forward signals until it ends, and
    return its exit code (128 + N when signal N ended it, as shells report it)."""
    waited = {*FORWARDED, signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    try:
        try:
            # The child starts with no signal blocked and default dispositions.
            pid = os.posix_spawnp(
                argv[0], list(argv), dict(env), setsigmask=(), setsigdef=FORWARDED
            )
        except FileNotFoundError:
            raise SpawnError(f"{argv[0]}: command not found", EXIT_NOT_FOUND) from None
        except PermissionError:
            raise SpawnError(f"{argv[0]}: permission denied", EXIT_NOT_EXECUTABLE) from None
        except OSError as error:
            raise SpawnError(f"{argv[0]}: {error.strerror}", EXIT_NOT_EXECUTABLE) from None
        return _wait(pid, waited)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _wait(pid: int, waited: set[signal.Signals]) -> int:
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else _SIGNAL_EXIT_BASE - code
        info = signal.sigwaitinfo(waited)
        if info.si_signo != signal.SIGCHLD and info.si_code <= 0:
            # It may have just ended: waitpid reports it next.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, info.si_signo)
