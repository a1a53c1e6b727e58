"""The agent's HTTP endpoint: ``/metrics`` (Prometheus), ``/healthz`` (the process answers)
and ``/readyz`` (200 once the device plugins are registered with kubelet, else 503 and why).

A DaemonSet's readiness probe on ``/readyz`` makes an agent that cannot reach kubelet show as
not ready in ``kubectl get pods`` instead of looking healthy while no GPU is advertised.
Called like prometheus_client's ``start_http_server``; the agent hands the server its
readiness check once the plugin manager exists (``server.readiness = ...``).
"""

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

Readiness = Callable[[], tuple[bool, str]]  # (ready, why: for people)


def _starting() -> tuple[bool, str]:
    return False, "starting: the device plugins are not running yet"


class EndpointServer(ThreadingWSGIServer):
    readiness: Readiness = staticmethod(_starting)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes every few seconds: not worth a log line each."""


def start_http_server(
    port: int, addr: str, registry: CollectorRegistry
) -> tuple[EndpointServer, threading.Thread]:
    metrics = make_wsgi_app(registry)
    family, host = _family(addr, port)

    class Server(EndpointServer):
        address_family = family

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            return _text(start_response, "200 OK", "ok")
        if path == "/readyz":
            ready, reason = server.readiness()
            return _text(start_response, "200 OK" if ready else "503 Service Unavailable", reason)
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return server, thread


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
