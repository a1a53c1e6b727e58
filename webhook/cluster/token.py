"""The bearer token for the API server, re-read from its file as the kubelet rotates it.

A projected service-account token is rewritten by the kubelet before it expires (and the
old one stops working when it expires or its pod goes); a client that read it once breaks
then. ``TokenFile`` re-reads the file when it changed (its inode, size or mtime; checked at
most every ``check_s``) and at least every ``reread_s`` (client-go re-reads every minute),
and on demand after a 401. The file is bounded and validated like any input: an unreadable,
empty, oversized or malformed file keeps the token last read and logs why.
"""

import logging
import os
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

MAX_TOKEN_BYTES: Final = 16 * 1024  # service-account JWTs are ~1 KiB
DEFAULT_REREAD_S: Final = 60.0
DEFAULT_CHECK_S: Final = 1.0
# RFC 6750 b64token characters: a token that is not one could split the header.
_TOKEN_CHARS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/="
)


class TokenError(ValueError):
    """The token file cannot give a usable token; the message says why."""


def read_token(path: str) -> str:
    """The token in ``path``, stripped; TokenError when it is missing, empty or malformed."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_TOKEN_BYTES + 1)
    except OSError as error:
        raise TokenError(f"cannot read the token file {path}: {error.strerror}") from None
    if len(raw) > MAX_TOKEN_BYTES:
        raise TokenError(f"token file {path} is over {MAX_TOKEN_BYTES} bytes")
    token = raw.decode("ascii", errors="replace").strip()
    if not token:
        raise TokenError(f"token file {path} is empty")
    if not set(token) <= _TOKEN_CHARS:
        raise TokenError(
            f"token file {path} holds characters a bearer token cannot have "
            "(allowed: letters, digits and -._~+/=)"
        )
    return token


class TokenFile:
    """The current token of one file; ``token()`` is cheap enough to call per request."""

    def __init__(
        self,
        path: str,
        *,
        reread_s: float = DEFAULT_REREAD_S,
        check_s: float = DEFAULT_CHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._reread_s = reread_s
        self._check_s = check_s
        self._clock = clock
        self._token = read_token(path)  # at start-up a bad file is an error, not a warning
        self._stamp = _stamp(path)
        self._read_at = self._checked_at = clock()
        self.reads = 1

    def token(self) -> str:
        now = self._clock()
        if now - self._read_at >= self._reread_s:
            self._reread(now)
        elif now - self._checked_at >= self._check_s:
            self._checked_at = now
            if _stamp(self.path) != self._stamp:
                self._reread(now)
        return self._token

    def renewed_since(self, sent: str) -> bool:
        """After a 401 for a request that sent ``sent``: re-read now; whether the token held now
        is another one to retry with. Compared with what the request sent, not with what was
        held before this re-read: a concurrent request (a watch reopening) may have read the
        new token in between, and this request must still retry."""
        self._reread(self._clock())
        return self._token != sent

    def _reread(self, now: float) -> None:
        self._read_at = self._checked_at = now
        # Taken before reading, and kept when the read fails: a bad file is not read (and
        # logged) again until it changes or the re-read interval passes.
        self._stamp = _stamp(self.path)
        try:
            token = read_token(self.path)
        except TokenError as error:
            log.warning("%s; still using the token read before", error)
            return
        self._token = token
        self.reads += 1


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
