"""The plugin's own small API client over real TLS on loopback: kubeconfig rules (explicit
file, $KUBECONFIG merged, context namespace), tokens, token files, exec credential plugins,
clear errors; and that the plugin no longer imports the ``kubernetes`` package."""

from __future__ import annotations

import base64
import datetime
import json
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.cli import selfsigned
from webhook.kubectl import fetch, kubeapi

ROOT = Path(__file__).resolve().parents[2]


def client_pair(authority: selfsigned.Authority, user: str) -> tuple[bytes, bytes]:
    """A client certificate (clientAuth) for ``user`` signed by ``authority``, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user)]))
        .issuer_name(authority.pair.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(authority.pair.key, hashes.SHA256())  # type: ignore[arg-type]
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(pem), key_pem


class FakeApiServer:
    """HTTPS on 127.0.0.1 answering GETs from a dict; records the Authorization headers and
    the common name of a client certificate (clients may present one, signed by
    ``client_ca``)."""

    def __init__(self, directory: Path) -> None:
        self.client_ca = selfsigned.new_authority()
        client_ca_file = directory / "client-ca.crt"
        authority = selfsigned.new_authority()
        self.ca, cert, key = selfsigned.write_files(
            directory, authority, selfsigned.issue_serving(authority, ("127.0.0.1",))
        )
        client_ca_file.write_bytes(self.client_ca.cert_pem)
        self.answers: dict[str, tuple[int, Any]] = {}
        self.seen: list[tuple[str, str]] = []
        self.client_names: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                api.seen.append((self.path, self.headers.get("Authorization", "")))
                peer = self.connection.getpeercert()  # type: ignore[attr-defined]
                if peer:
                    api.client_names.append(dict(x[0] for x in peer["subject"])["commonName"])
                status, body = api.answers.get(self.path, (404, {"message": "nope"}))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(client_ca_file)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    server = FakeApiServer(tmp_path / "tls")
    yield server
    server.close()


def kubeconfig(path: Path, server: str, ca: Path | None, user: dict[str, Any], **ctx: str) -> Path:
    cluster: dict[str, Any] = {"server": server}
    if ca is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "main",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u", **ctx}}],
            }
        )
    )
    return path


NODES = "/apis/fracgpu.io/v1alpha1/gpunodes"


def test_token_and_context_namespace(api: FakeApiServer, tmp_path: Path) -> None:
    api.answers[NODES] = (200, {"items": [{"metadata": {"name": "n1"}}]})
    path = kubeconfig(tmp_path / "k", api.url, api.ca, {"token": "t0k"}, namespace="team-a")
    client, namespace = fetch.connect(str(path), None)
    try:
        assert namespace == "team-a"
        assert [n["metadata"]["name"] for n in fetch.gpunodes(client)] == ["n1"]
        assert fetch.gpunodes(client)  # the kept-alive connection serves a second call
    finally:
        client.close()
    assert api.seen[0] == (NODES, "Bearer t0k")


def test_client_certificate_inline_or_in_files(api: FakeApiServer, tmp_path: Path) -> None:
    api.answers[NODES] = (200, {"items": []})
    cert, key = client_pair(api.client_ca, "alice")
    inline = {
        "client-certificate-data": base64.b64encode(cert).decode(),
        "client-key-data": base64.b64encode(key).decode(),
    }
    bob_cert, bob_key = client_pair(api.client_ca, "bob")
    (tmp_path / "bob.crt").write_bytes(bob_cert)
    (tmp_path / "bob.key").write_bytes(bob_key)
    files = {"client-certificate": "bob.crt", "client-key": "bob.key"}  # relative to the file
    for name, user in (("inline", inline), ("files", files)):
        client, _ = fetch.connect(str(kubeconfig(tmp_path / name, api.url, api.ca, user)), None)
        try:
            fetch.gpunodes(client)
        finally:
            client.close()
    assert api.client_names == ["alice", "bob"]
    assert [auth for _, auth in api.seen] == ["", ""]


def test_kubeconfig_env_is_merged_first_wins(api: FakeApiServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    first = kubeconfig(tmp_path / "a", api.url, api.ca, {"tokenFile": "token"})
    second = tmp_path / "b"
    second.write_text(
        yaml.safe_dump(
            {
                "current-context": "other",
                "users": [{"name": "u", "user": {"token": "loses"}}],
                "contexts": [{"name": "other", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    env = {"KUBECONFIG": f"{first}:{tmp_path / 'missing'}:{second}"}
    creds = kubeapi.load(None, None, env)
    assert creds.headers["Authorization"] == "Bearer from-file"  # relative to its file
    assert creds.namespace == "default"
    assert kubeapi.load(None, "other", env).headers["Authorization"] == "Bearer from-file"


def test_exec_credential_plugin(api: FakeApiServer, tmp_path: Path) -> None:
    api.answers[NODES] = (200, {"items": []})
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json, os\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "    'status': {'token': 'exec-' + os.environ['EXTRA']}}))\n"
    )
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(plugin)],
            "env": [{"name": "EXTRA", "value": "42"}],
        }
    }
    client, _ = fetch.connect(str(kubeconfig(tmp_path / "k", api.url, api.ca, user)), None)
    try:
        fetch.gpunodes(client)
    finally:
        client.close()
    assert api.seen == [(NODES, "Bearer exec-42")]


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ({"auth-provider": {"name": "gcp"}}, "auth-provider 'gcp' is not supported"),
        ({"exec": {"command": "/nonexistent/plugin"}}, "exec '/nonexistent/plugin' failed"),
        ({"tokenFile": "/nonexistent/token"}, "tokenFile /nonexistent/token"),
    ],
)
def test_unusable_credentials_are_explained(
    api: FakeApiServer, tmp_path: Path, user: dict[str, Any], message: str
) -> None:
    with pytest.raises(fetch.FetchError, match="cannot load the kubeconfig") as raised:
        fetch.connect(str(kubeconfig(tmp_path / "k", api.url, api.ca, user)), None)
    assert message in str(raised.value)


def test_api_errors_and_tls_errors_are_explained(api: FakeApiServer, tmp_path: Path) -> None:
    api.answers[NODES] = (403, {"message": 'gpunodes is forbidden: User "bob"'})
    client, _ = fetch.connect(str(kubeconfig(tmp_path / "k", api.url, api.ca, {})), None)
    with pytest.raises(fetch.FetchError, match=r'forbidden .*User "bob".*ask for read access'):
        fetch.gpunodes(client)
    client.close()
    # Without the CA the server's certificate is not trusted.
    client, _ = fetch.connect(str(kubeconfig(tmp_path / "k2", api.url, None, {})), None)
    with pytest.raises(fetch.FetchError, match="TLS verification failed"):
        fetch.gpunodes(client)
    client.close()
    # An API server without fracgpu's CRDs answers 404 to the list.
    client, _ = fetch.connect(str(tmp_path / "k"), None)
    with pytest.raises(fetch.FetchError, match="not found: the fracgpu CRDs are not installed"):
        fetch.gpuquotas(client, None)
    client.close()
    proxied = yaml.safe_load((tmp_path / "k").read_text())
    proxied["clusters"][0]["cluster"]["proxy-url"] = "http://proxy:3128"
    (tmp_path / "proxied").write_text(yaml.safe_dump(proxied))
    with pytest.raises(fetch.FetchError, match="proxy-url is not supported"):
        fetch.connect(str(tmp_path / "proxied"), None)
    with pytest.raises(fetch.FetchError, match="context 'nope' is not in the kubeconfig"):
        fetch.connect(str(tmp_path / "k"), "nope")
    (tmp_path / "bad").write_text("clusters: [\n")
    with pytest.raises(fetch.FetchError, match="bad:2: not valid YAML"):
        fetch.connect(str(tmp_path / "bad"), None)


def test_the_plugin_does_not_import_the_kubernetes_package() -> None:
    probe = (
        "import sys\n"
        "from webhook.kubectl import plugin as kubectl_plugin\n"
        "kubectl_plugin.main(['--kubeconfig', '/nonexistent', 'nodes'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kubernetes', 'prometheus_client', 'numpy', 'aiohttp')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "[]"
