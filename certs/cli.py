"""`fracgpu-certs ensure | run | files`: see `fracgpu-certs --help` and docs/certificates.md."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from types import FrameType

from . import authority, files
from .commandline import Command, parse_command_line
from .durations import format_duration
from .errors import CertsError
from .reconcile import ensure
from .settings import Settings
from .store import KubeStore, connect

log = logging.getLogger("fracgpu.certs")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _utc_now() -> datetime:
    return datetime.now(UTC)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    try:
        command = parse_command_line(sys.argv[1:] if argv is None else argv)
    except CertsError as error:
        print(f"fracgpu-certs: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if command.settings.cert_manager and command.name != "files":
        log.info(
            "cert-manager mode: cert-manager issues the serving certificate and its CA "
            "injector sets the caBundle; nothing to do (see docs/certificates.md)"
        )
        return EXIT_OK
    try:
        if command.name == "ensure":
            return _ensure_once(command.settings)
        if command.name == "run":
            return _run_loop(command.settings)
        return _write_files(command)
    except CertsError as error:
        log.error("%s", error)
        return EXIT_FAILED


def _ensure_once(settings: Settings) -> int:
    store = KubeStore(connect(settings), settings)
    outcome = ensure(store, settings, _utc_now)
    log.info("%s", outcome.summary())
    return EXIT_OK


def _run_loop(settings: Settings) -> int:
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping after the current step", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    store = KubeStore(connect(settings), settings)
    log.info("checking every %s", format_duration(settings.interval))
    while not stop.is_set():
        pause = _one_pass(store, settings, _utc_now)
        log.info("next check in %s", format_duration(pause))
        stop.wait(pause.total_seconds())
    log.info("stopped")
    return EXIT_OK


def _one_pass(store: KubeStore, settings: Settings, clock: Callable[[], datetime]) -> timedelta:
    """Reconcile once; how long to wait before the next pass."""
    try:
        outcome = ensure(store, settings, clock)
    except CertsError as error:
        log.error("%s (retrying in %s)", error, format_duration(settings.retry_interval))
        return settings.retry_interval
    except Exception:  # the loop must survive anything a pass throws (network, API server)
        log.exception("unexpected error (retrying in %s)", format_duration(settings.retry_interval))
        return settings.retry_interval
    log.info("%s", outcome.summary())
    pause = settings.interval
    if outcome.next_due is not None:
        # Wake up for a renewal or the end of a CA overlap that falls before the next check.
        pause = min(pause, max(outcome.next_due - clock(), timedelta(seconds=1)))
    return pause


def _write_files(command: Command) -> int:
    assert command.directory is not None
    settings = command.settings
    now = _utc_now()
    ca = authority.new_ca(now, settings.ca_validity)
    serving = authority.issue_serving(
        ca, settings.dns_names, now, settings.serving_validity, settings.extra_ip_addresses
    )
    payload = {"ca.crt": ca.cert_pem(), "tls.crt": serving.cert_pem(), "tls.key": serving.key_pem()}
    if command.projected:
        files.project(command.directory, payload, now)
    else:
        files.write_files(command.directory, payload)
    log.info(
        "wrote ca.crt, tls.crt, tls.key to %s (names: %s)",
        command.directory,
        ", ".join(settings.dns_names + settings.extra_ip_addresses),
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
