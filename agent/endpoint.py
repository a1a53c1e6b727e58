"""The agent's HTTP endpoint: ``/metrics`` (Prometheus), ``/healthz`` (the process answers)
and ``/readyz`` (200 once the device plugins are registered with kubelet, else 503 and why).

A DaemonSet's readiness probe on ``/readyz`` makes an agent that cannot reach kubelet show as
not ready in ``kubectl get pods`` instead of looking healthy while no GPU is advertised.
"""

import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes every few seconds: not worth a log line each."""


@dataclass
class Endpoint:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start(
    address: str,
    port: int,
    registry: CollectorRegistry,
    readiness: Callable[[], tuple[bool, str]],  # (ready, why: for people)
) -> Endpoint:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            return _text(start_response, "200 OK", "ok")
        if path == "/readyz":
            ready, reason = readiness()
            return _text(start_response, "200 OK" if ready else "503 Service Unavailable", reason)
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    family, host = _family(address, port)

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return Endpoint(server, thread)


def _text(start_response: Callable[..., Any], status: str, body: str) -> list[bytes]:
    data = (body + "\n").encode()
    start_response(
        status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))]
    )
    return [data]


def _family(address: str, port: int) -> tuple[socket.AddressFamily, str]:
    """IPv4 or IPv6, from the address the flag names."""
    infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])
