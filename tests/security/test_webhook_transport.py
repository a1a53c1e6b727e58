"""The API server → webhook link is TLS 1.2+ only: the real `fracgpu serve` process answers
an admission review over verified TLS and nothing else on its port, neither plain HTTP
nor TLS 1.0/1.1 (with a client shown able to speak those to a server that allows them)."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.webhook.support import gpu_pod, write_tls
from webhook.cli.client import build_review, trusting

ROOT = Path(__file__).resolve().parents[2]
TLS_ALERT = 0x15  # TLS record type of an alert


@dataclass(frozen=True)
class Served:
    port: int
    ca: Path
    cert: Path
    key: Path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("webhook-tls")
    _, ca, cert, key = write_tls(directory)
    port = _free_port()
    args = [
        sys.executable, "-m", "webhook.cli.main", "serve",
        "--host", "127.0.0.1", "--port", str(port),
        "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--cluster-file", str(ROOT / "examples" / "cluster.yaml"),
    ]  # fmt: skip
    process = subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                url = f"https://127.0.0.1:{port}/readyz"
                with urllib.request.urlopen(url, context=trusting(ca), timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("fracgpu serve never became ready") from None
                time.sleep(0.1)
        yield Served(port, ca, cert, key)
    finally:
        process.terminate()
        process.wait(30)
        if process.stderr is not None:
            process.stderr.close()


def _review_request(path: str) -> bytes:
    body = json.dumps(build_review(gpu_pod({"nvidia.com/gpu": "1"}))).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_an_admission_review_over_verified_tls_is_answered(served: Served) -> None:
    with (
        socket.create_connection(("127.0.0.1", served.port), timeout=10) as raw,
        trusting(served.ca).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        tls.sendall(_review_request("/validate"))
        reply = _read_all(tls)
    assert reply.startswith(b"HTTP/1.1 200")
    assert b'"kind":"AdmissionReview"' in reply.replace(b" ", b"")


@pytest.mark.parametrize("path", ["/validate", "/mutate", "/healthz"])
def test_plain_http_gets_no_http_answer(served: Served, path: str) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as raw:
        raw.sendall(_review_request(path))
        try:
            reply = _read_all(raw)
        except ConnectionResetError:
            reply = b""
    assert not reply.startswith(b"HTTP"), reply[:80]
    assert reply == b"" or reply[0] == TLS_ALERT, reply[:80]


def _old_tls_client(ca: Path, version: ssl.TLSVersion) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the point is to use it
        context.minimum_version = version
        context.maximum_version = version
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 speaks TLS < 1.2 only at level 0
    return context


def _permissive_server(served: Served, version: ssl.TLSVersion) -> tuple[int, threading.Thread]:
    """A one-shot TLS server that accepts ``version``: proof the client can speak it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(served.cert, served.key)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = version
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    listener = socket.create_server(("127.0.0.1", 0))

    def accept_one() -> None:
        with listener:
            conn, _ = listener.accept()
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=accept_one, daemon=True)
    thread.start()
    return int(listener.getsockname()[1]), thread


def _handshake(port: int, context: ssl.SSLContext) -> str | None:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        return tls.version()


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1])
def test_tls_below_1_2_is_refused(served: Served, version: ssl.TLSVersion) -> None:
    client = _old_tls_client(served.ca, version)
    port, thread = _permissive_server(served, version)
    assert _handshake(port, client) == version.name.replace("_", ".")
    thread.join(10)
    with pytest.raises(ssl.SSLError):
        _handshake(served.port, client)
