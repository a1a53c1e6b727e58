"""Free loopback TCP ports for the control-plane processes."""

from __future__ import annotations

import socket


def free_port() -> int:
    # The kernel picks an unused port; another process could take it before we bind it,
    # which is why the control plane retries its start on a bind failure.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
