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


class _EncryptedKeyError(Exception):
    """The key file asks for a passphrase (raised instead of prompting on the terminal)."""


def _no_passphrase() -> bytes:
    raise _EncryptedKeyError


def _load(context: ssl.SSLContext, files: TLSFiles) -> None:
    try:
        context.load_cert_chain(certfile=files.cert, keyfile=files.key, password=_no_passphrase)
    except _EncryptedKeyError:
        raise TLSConfigError(
            f"TLS key file {files.key} does not load: it is encrypted (there is no passphrase "
            f"to give); give the private key of the certificate in {files.cert} unencrypted, "
            "as a kubernetes.io/tls Secret holds it"
        ) from None
    except (OSError, ssl.SSLError) as error:
        raise TLSConfigError(_why_not(files, error)) from None


def _why_not(files: TLSFiles, error: OSError) -> str:
    """Which file is wrong and how: OpenSSL alone says "[SSL] PEM lib" for most of it."""
    for what, path in (("certificate", files.cert), ("key", files.key)):
        try:
            path.open("rb").close()
        except OSError as unreadable:
            return f"TLS {what} file {path} cannot be read: {unreadable.strerror or unreadable}"
    # NO_CERTIFICATE_ASSIGNED: a key of another type (EC for an RSA certificate).
    if getattr(error, "reason", None) in ("KEY_VALUES_MISMATCH", "NO_CERTIFICATE_ASSIGNED"):
        return (
            f"TLS key file {files.key} does not match the certificate in {files.cert}: give "
            "the private key the certificate was issued for"
        )
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=files.cert)
    except (OSError, ssl.SSLError):
        return (
            f"TLS certificate file {files.cert} does not load: it holds no PEM certificate "
            "(-----BEGIN CERTIFICATE-----)"
        )
    if isinstance(error, ssl.SSLError) and error.library in ("SSL", "PEM"):
        return (
            f"TLS key file {files.key} does not load: it holds no PEM private key (-----BEGIN "
            f"PRIVATE KEY-----) for the certificate in {files.cert}"
        )
    return f"TLS certificate {files.cert} with key {files.key} cannot be used: {error}"


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
