"""Serving TLS from files, reloaded in place when the files change.

Kubernetes updates a mounted Secret by swapping a symlink, so the path stays the same while
the file behind it changes: the watcher compares the resolved path, inode, size and mtime.
Reloading calls ``load_cert_chain`` on the live ``SSLContext``: new handshakes get the new
certificate, open connections keep theirs, and nothing restarts. A half-written or
mismatched pair is logged and the old certificate stays until the next good one.
"""

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FileStamp = tuple[str, int, int, int]


class TLSConfigError(Exception):
    """The certificate or key files cannot be used; says which and why."""


@dataclass
class TLSFiles:
    cert: Path
    key: Path


def server_context(files: TLSFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    _load(context, files)
    return context


def _load(context: ssl.SSLContext, files: TLSFiles) -> None:
    try:
        context.load_cert_chain(certfile=files.cert, keyfile=files.key)
    except (OSError, ssl.SSLError) as error:
        raise TLSConfigError(
            f"cannot load TLS certificate {files.cert} with key {files.key}: {error}"
        ) from None


def stamp(path: Path) -> FileStamp:
    resolved = os.path.realpath(path)
    info = os.stat(resolved)
    return (resolved, info.st_ino, info.st_size, info.st_mtime_ns)


class CertificateReloader:
    """Watches the files behind a live SSLContext and reloads it when they change."""

    def __init__(self, files: TLSFiles, interval_seconds: float) -> None:
        self.files = files
        self.context = server_context(files)
        self._interval = interval_seconds
        self._stamps = self._current()
        self.reloads = 0

    def _current(self) -> tuple[FileStamp, FileStamp] | None:
        try:
            return stamp(self.files.cert), stamp(self.files.key)
        except OSError:
            return None

    def check(self) -> bool:
        """Reload if the files changed; True when a new certificate is in use."""
        current = self._current()
        if current is None or current == self._stamps:
            return False
        try:
            # Trial load first: a failed load_cert_chain can leave a context half-changed.
            _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), self.files)
            _load(self.context, self.files)
        except TLSConfigError as error:
            # Files mid-swap or a key that does not match yet: keep serving the old pair.
            log.warning("TLS files changed but are not usable yet: %s", error)
            return False
        self._stamps = current
        self.reloads += 1
        log.info("reloaded TLS certificate from %s", self.files.cert)
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.check()
