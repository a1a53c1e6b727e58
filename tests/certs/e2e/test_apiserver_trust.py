"""kube-apiserver itself (Go's TLS client) calls a webhook served with the certificate from the
Secret and trusts it through the caBundle that `ensure` patched, including across a CA
rotation: before, during and after the overlap."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socket import socket
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from certs import authority
from certs.authority import CertKeyPair
from certs.durations import Window
from certs.reconcile import ensure
from certs.settings import Settings
from certs.store import KubeStore

from .conftest import admission_api, core_api, webhook_entry

pytestmark = pytest.mark.e2e

DENIAL = "denied by the certs e2e webhook"


class _Handler(BaseHTTPRequestHandler):
    """Denies every request it is asked about (HTTP/1.0: one handshake per call)."""

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": False,
                    "status": {"code": 403, "message": DENIAL},
                },
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class WebhookServer(ThreadingHTTPServer):
    """An HTTPS server on 127.0.0.1 whose certificate can be swapped (a hot reload)."""

    daemon_threads = True

    def __init__(self, directory: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self._directory = directory
        self._context: ssl.SSLContext | None = None

    def present(self, pair: CertKeyPair) -> None:
        cert, key = self._directory / "tls.crt", self._directory / "tls.key"
        cert.write_bytes(pair.cert_pem())
        key.write_bytes(pair.key_pem())
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self._context = context

    def get_request(self) -> tuple[socket, Any]:
        connection, address = super().get_request()
        assert self._context is not None
        # A refused handshake raises SSLError (an OSError): socketserver drops the request.
        return self._context.wrap_socket(connection, server_side=True), address

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server_address[1]}/validate"


@pytest.fixture
def webhook_server(tmp_path: Path) -> Iterator[WebhookServer]:
    server = WebhookServer(tmp_path)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def _admission_error(client: kubernetes.client.ApiClient, namespace: str) -> str:
    """Create a ConfigMap; the webhook must refuse it. Returns the apiserver's message."""
    try:
        core_api(client).create_namespaced_config_map(
            namespace, {"metadata": {"name": f"probe-{uuid.uuid4().hex[:6]}"}}
        )
    except ApiException as error:
        message: str = json.loads(error.body or "{}")["message"]
        return message
    raise AssertionError("the ConfigMap was admitted: the webhook was not called")


def _eventually(probe: Callable[[], str], expected: str, timeout_s: float = 20) -> str:
    """The apiserver picks up configuration changes through a watch: allow it a moment."""
    deadline = time.monotonic() + timeout_s
    while True:
        message = probe()
        if expected in message or time.monotonic() > deadline:
            return message
        time.sleep(0.2)


def _serving_pair(client: kubernetes.client.ApiClient, settings: Settings) -> CertKeyPair:
    secret = core_api(client).read_namespaced_secret(settings.secret, settings.namespace)
    return authority.decode_pair(
        base64.b64decode(secret.data["tls.crt"]), base64.b64decode(secret.data["tls.key"])
    )


def _sleep_until(moment: datetime | None) -> None:
    assert moment is not None
    time.sleep(max(0.0, (moment - datetime.now(UTC)).total_seconds()) + 0.05)


def test_kube_apiserver_trusts_the_patched_ca_bundle_through_a_ca_rotation(
    kube_client: kubernetes.client.ApiClient, namespace: str, webhook_server: WebhookServer
) -> None:
    name = f"certs-trust-{uuid.uuid4().hex[:6]}"
    admission = admission_api(kube_client)
    entry = webhook_entry(f"trust.{name}.fracgpu.io", {"url": webhook_server.url})
    admission.create_validating_webhook_configuration(
        {"metadata": {"name": name}, "webhooks": [entry]}
    )
    core_api(kube_client).patch_namespace(
        namespace, {"metadata": {"labels": {"certs-e2e": entry["name"]}}}
    )
    # Short real lifetimes: the apiserver checks certificates against the real clock.
    settings = Settings(
        namespace=namespace,
        mutating_webhook="",
        validating_webhook=name,
        extra_ip_addresses=("127.0.0.1",),
        ca_validity=timedelta(minutes=10),
        ca_renew_before=Window(fraction=0.99),  # due 6 s after creation
        serving_validity=timedelta(minutes=10),
        serving_renew_before=Window(fraction=0.98),
        ca_overlap=timedelta(seconds=3),
    )
    store = KubeStore(kube_client, settings)

    def probe() -> str:
        return _admission_error(kube_client, namespace)

    try:
        # Before: a certificate from a CA the apiserver was never told about is refused.
        stranger = authority.new_ca(datetime.now(UTC), timedelta(hours=1))
        webhook_server.present(
            authority.issue_serving(
                stranger, settings.dns_names, datetime.now(UTC), timedelta(hours=1), ["127.0.0.1"]
            )
        )
        assert "x509" in _eventually(probe, "x509")

        created = ensure(store, settings, lambda: datetime.now(UTC))
        first = _serving_pair(kube_client, settings)
        webhook_server.present(first)
        assert DENIAL in _eventually(probe, DENIAL)

        # Rotation: the caBundle holds both CAs, so the replica still serving the old
        # certificate keeps working, and so does the one that reloaded the new one.
        _sleep_until(created.next_due)
        rotation = ensure(store, settings, lambda: datetime.now(UTC))
        assert "rotate-ca" in rotation.decision.summary()
        second = _serving_pair(kube_client, settings)
        assert second.cert != first.cert
        time.sleep(2)  # let the apiserver's watch deliver the new caBundle
        assert DENIAL in probe()  # old certificate, still trusted
        webhook_server.present(second)
        assert DENIAL in _eventually(probe, DENIAL)  # new certificate, trusted

        # After the overlap the old CA is dropped: the old certificate is refused again.
        _sleep_until(rotation.next_due)
        dropped = ensure(store, settings, lambda: datetime.now(UTC))
        assert dropped.decision.summary().startswith("update-bundle: drop 1")
        assert DENIAL in probe()
        webhook_server.present(first)
        assert "x509" in _eventually(probe, "x509")
    finally:
        admission.delete_validating_webhook_configuration(name)
