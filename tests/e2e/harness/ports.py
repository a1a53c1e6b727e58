"""Free loopback TCP ports for the control-plane processes."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000
_ATTEMPTS = 200


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port that is free now and outside the kernel's ephemeral range.

    Outgoing connections take their local ports from the ephemeral range; a server that
    must come back on the same port after a restart could find it held by one of them.
    Another process could still take the port before the child binds it, which is why the
    control plane retries its start on a bind failure.
    """
    low, high = _ephemeral_range()
    candidates = [(_LOWEST, low - 1)] if low - 1 > _LOWEST else []
    if high + 1 < 65535:
        candidates.append((high + 1, 65535))
    rng = random.SystemRandom()
    for _ in range(_ATTEMPTS if candidates else 0):
        first, last = rng.choice(candidates)
        port = rng.randint(first, last)
        if _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen
