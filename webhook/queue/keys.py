"""A secret every webhook replica holds and tenants do not: derived from the serving key.

All replicas mount one TLS Secret, so a key derived from its private key lets one replica
prove a message came from a replica (relayed extender calls) and lets validation tell a
queued entry fracgpu sealed from one a tenant wrote. The file is read again when it
changes (certificate rotation); the key before the change is still accepted, so messages
made just before a rotation still check.
"""

import hashlib
import os
import secrets
from pathlib import Path


class SharedKey:
    def __init__(self, key_file: Path | None, purpose: str) -> None:
        self._file = key_file
        self._purpose = purpose.encode()
        self._stamp: tuple[int, int] | None = None
        self._current = secrets.token_bytes(32)  # no file (embedded mode): this process only
        self._previous: bytes | None = None
        self.current()

    def current(self) -> bytes:
        if self._file is None:
            return self._current
        try:
            info = os.stat(self._file)
        except OSError:
            return self._current
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp != self._stamp:
            derived = hashlib.sha256(self._purpose + b"\0" + self._file.read_bytes()).digest()
            if self._stamp is not None and derived != self._current:
                self._previous = self._current
            self._current, self._stamp = derived, stamp
        return self._current

    def accepted(self) -> tuple[bytes, ...]:
        """Keys a message may have been made with: the current one, then the one before."""
        current = self.current()
        return (current,) if self._previous is None else (current, self._previous)
