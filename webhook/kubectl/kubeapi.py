"""A small synchronous client for the few GET requests the kubectl plugin makes.

The ``kubernetes`` package takes about a second to import (every API model class); a
kubectl plugin should answer in a fraction of that, so this reads the kubeconfig itself
(kubectl's rules: ``--kubeconfig``, else every file in ``$KUBECONFIG`` merged with the
first value winning, else ``~/.kube/config``) and talks HTTPS with the standard library.

Credentials supported: client certificates (files or inline data), bearer tokens (inline
or ``tokenFile``), basic auth, and exec credential plugins (``client.authentication.k8s.io``
v1 / v1beta1, as EKS, GKE and AKS use). The legacy ``auth-provider`` entries are refused
with a message: kubectl itself replaced them with exec plugins.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import subprocess
import tempfile
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

TIMEOUT_S: Final = 15.0
EXEC_TIMEOUT_S: Final = 60.0
MAX_BODY_BYTES: Final = 256 * 2**20  # a list of every pod of a large cluster fits


class KubeConfigError(Exception):
    """The kubeconfig cannot be used; says which entry and why."""


class KubeApiError(Exception):
    """The API server answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}" if status else reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Credentials:
    server: str
    namespace: str
    ca_pem: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as error:
        raise KubeConfigError(f"cannot read {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise KubeConfigError(f"{where}: not valid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise KubeConfigError(f"{path}: not a kubeconfig (the top level is not a mapping)")
    return data


def _files(explicit: str | None, env: Mapping[str, str]) -> list[Path]:
    if explicit:
        return [Path(explicit).expanduser()]
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return [Path(p).expanduser() for p in listed]
    return [Path("~/.kube/config").expanduser()]


def _merged(files: list[Path], explicit: bool) -> tuple[dict[str, Any], dict[str, Path]]:
    """The merged kubeconfig and, per (kind, name), the file it came from (relative paths)."""
    merged: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}}
    origin: dict[str, Path] = {}
    found = False
    for path in files:
        if not explicit and not path.exists():
            continue  # kubectl skips missing files in $KUBECONFIG
        found = True
        data = _load_yaml(path)
        if "current-context" not in merged and data.get("current-context"):
            merged["current-context"] = data["current-context"]
        for kind, inner in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for entry in data.get(kind) or []:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise KubeConfigError(f"{path}: every entry of {kind} needs a name")
                if entry["name"] not in merged[kind]:
                    merged[kind][entry["name"]] = entry.get(inner) or {}
                    origin[f"{kind}/{entry['name']}"] = path.parent
    if not found:
        raise KubeConfigError(
            "no kubeconfig found: pass --kubeconfig, set KUBECONFIG or create ~/.kube/config"
        )
    return merged, origin


def load(
    kubeconfig: str | None, context: str | None, env: Mapping[str, str] | None = None
) -> Credentials:
    """Credentials for the chosen (or current) context."""
    env = os.environ if env is None else env
    merged, origin = _merged(_files(kubeconfig, env), kubeconfig is not None)
    name = context or merged.get("current-context")
    if not name:
        raise KubeConfigError(
            "no current context: pass --context or run kubectl config use-context"
        )
    ctx = merged["contexts"].get(name)
    if ctx is None:
        raise KubeConfigError(f"context {name!r} is not in the kubeconfig")
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    cluster = merged["clusters"].get(cluster_name)
    if cluster is None:
        raise KubeConfigError(f"context {name!r} names cluster {cluster_name!r}, which is missing")
    user = merged["users"].get(user_name, {}) if user_name else {}
    if not isinstance(cluster.get("server"), str) or not cluster["server"].startswith("https://"):
        raise KubeConfigError(
            f"cluster {cluster_name!r}: server {cluster.get('server')!r} is not an https:// URL"
        )
    if cluster.get("proxy-url"):
        raise KubeConfigError(
            f"cluster {cluster_name!r}: proxy-url is not supported by kubectl fracgpu: reach "
            "the API server directly (for example through kubectl port-forward or a VPN)"
        )
    base = origin.get(f"clusters/{cluster_name}", Path.cwd())
    user_base = origin.get(f"users/{user_name}", Path.cwd())
    ca = _data_or_file(cluster, "certificate-authority", base)
    cert = _data_or_file(user, "client-certificate", user_base)
    key = _data_or_file(user, "client-key", user_base)
    headers: dict[str, str] = {}
    if user.get("auth-provider"):
        provider = (user["auth-provider"] or {}).get("name", "?")
        raise KubeConfigError(
            f"user {user_name!r}: auth-provider {provider!r} is not supported by kubectl "
            "fracgpu: use an exec credential plugin (kubectl's replacement for auth providers)"
        )
    if user.get("exec"):
        token, exec_cert, exec_key = _run_exec(user["exec"], user_name or "", cluster, env)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        cert, key = exec_cert or cert, exec_key or key
    elif user.get("token"):
        headers["Authorization"] = f"Bearer {user['token']}"
    elif user.get("tokenFile"):
        path = _resolve(str(user["tokenFile"]), user_base)
        try:
            headers["Authorization"] = f"Bearer {path.read_text().strip()}"
        except OSError as error:
            raise KubeConfigError(
                f"user {user_name!r}: tokenFile {path}: {error.strerror}"
            ) from None
    elif user.get("username") and user.get("password"):
        pair = f"{user['username']}:{user['password']}".encode()
        headers["Authorization"] = f"Basic {base64.b64encode(pair).decode()}"
    return Credentials(
        server=cluster["server"].rstrip("/"),
        namespace=str(ctx.get("namespace") or "default"),
        ca_pem=ca,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name"),
        cert_pem=cert,
        key_pem=key,
        headers=headers,
    )


def _resolve(path: str, base: Path) -> Path:
    resolved = Path(path).expanduser()
    return resolved if resolved.is_absolute() else base / resolved


def _data_or_file(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    data = entry.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except ValueError:
            raise KubeConfigError(f"{key}-data is not base64") from None
    if entry.get(key):
        path = _resolve(str(entry[key]), base)
        try:
            return path.read_bytes()
        except OSError as error:
            raise KubeConfigError(f"{key} {path}: {error.strerror or error}") from None
    return None


def _run_exec(
    spec: Mapping[str, Any], user: str, cluster: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[str | None, bytes | None, bytes | None]:
    """Run an exec credential plugin; (token, client cert, client key) from its answer."""
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise KubeConfigError(f"user {user!r}: exec needs a command")
    api_version = str(spec.get("apiVersion") or "client.authentication.k8s.io/v1beta1")
    request: dict[str, Any] = {"apiVersion": api_version, "kind": "ExecCredential"}
    request["spec"] = {"interactive": False}
    if spec.get("provideClusterInfo"):
        request["spec"]["cluster"] = {"server": cluster.get("server")}
    child_env = dict(env)
    for item in spec.get("env") or []:
        child_env[str(item.get("name"))] = str(item.get("value", ""))
    child_env["KUBERNETES_EXEC_INFO"] = json.dumps(request)
    args = [command, *map(str, spec.get("args") or [])]
    try:
        done = subprocess.run(
            args,
            env=child_env,
            capture_output=True,
            text=True,
            timeout=EXEC_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        hint = spec.get("installHint") or ""
        raise KubeConfigError(f"user {user!r}: exec {command!r} failed: {error}. {hint}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        raise KubeConfigError(
            f"user {user!r}: exec {command!r} exited with {done.returncode}: {last}"
        )
    try:
        status = json.loads(done.stdout).get("status") or {}
    except (json.JSONDecodeError, AttributeError):
        raise KubeConfigError(
            f"user {user!r}: exec {command!r} printed no ExecCredential"
        ) from None
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    return (
        status.get("token"),
        cert.encode() if isinstance(cert, str) else None,
        key.encode() if isinstance(key, str) else None,
    )


class KubeClient:
    """GETs JSON (or text) from the API server over one kept-alive HTTPS connection."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        parsed = urllib.parse.urlsplit(credentials.server)
        self._host = parsed.hostname or ""
        self._port = parsed.port or 443
        self._prefix = parsed.path.rstrip("/")
        self._context = self._ssl_context()
        self._connection: http.client.HTTPSConnection | None = None

    def _ssl_context(self) -> ssl.SSLContext:
        creds = self.credentials
        context = ssl.create_default_context(cadata=creds.ca_pem.decode() if creds.ca_pem else None)
        if creds.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if creds.cert_pem and creds.key_pem:
            # ssl loads a client key pair from files only: a private temporary directory.
            with tempfile.TemporaryDirectory(prefix="kubectl-fracgpu-") as tmp:
                cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
                cert.write_bytes(creds.cert_pem)
                key.touch(mode=0o600)
                key.write_bytes(creds.key_pem)
                try:
                    context.load_cert_chain(cert, key)
                except ssl.SSLError as error:
                    raise KubeConfigError(f"client certificate or key unusable: {error}") from None
        return context

    def _connect(self) -> http.client.HTTPSConnection:
        if self._connection is None:
            self._connection = _Connection(
                self._host,
                self._port,
                timeout=TIMEOUT_S,
                context=self._context,
                server_name=self.credentials.tls_server_name or self._host,
            )
        return self._connection

    def get(self, path: str, **params: str) -> Any:
        return json.loads(self.get_text(path, accept="application/json", **params))

    def get_text(self, path: str, accept: str = "*/*", **params: str) -> str:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        headers = {"Accept": accept, "User-Agent": "kubectl-fracgpu", **self.credentials.headers}
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            connection = self._connect()
            try:
                connection.request("GET", self._prefix + path + query, headers=headers)
                response = connection.getresponse()
                body = response.read(MAX_BODY_BYTES + 1)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt:
                    raise KubeApiError(0, "the API server closed the connection") from None
                continue
            except ssl.SSLCertVerificationError as error:
                self.close()
                raise KubeApiError(0, f"TLS verification failed ({error.verify_message})") from None
            except OSError as error:
                self.close()
                raise KubeApiError(0, f"cannot reach the API server ({error})") from None
            if len(body) > MAX_BODY_BYTES:
                self.close()
                raise KubeApiError(0, f"answer larger than {MAX_BODY_BYTES // 2**20} MiB")
            if response.status >= 400:
                raise KubeApiError(response.status, _reason(response.reason, body))
            return body.decode("utf-8", errors="replace")
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class _Connection(http.client.HTTPSConnection):
    """HTTPS whose certificate is checked against the kubeconfig's tls-server-name, if any."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float,
        context: ssl.SSLContext,
        server_name: str,
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._tls_context = context
        self._server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls_context.wrap_socket(self.sock, server_hostname=self._server_name)


def _reason(reason: str, body: bytes) -> str:
    """The Status object's message when the body holds one."""
    try:
        status = json.loads(body)
    except ValueError:
        return reason
    message = status.get("message") if isinstance(status, dict) else None
    return f"{reason}: {message}" if message else reason
