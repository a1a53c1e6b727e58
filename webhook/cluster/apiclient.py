"""A small async client for the Kubernetes REST API, on aiohttp.

The webhook answers admission inside the API server's timeout, so its calls are async and
share one connection pool; connection details come from a kubeconfig or the in-cluster
service account, read with the ``kubernetes`` package. A token that comes from a file (the
in-cluster projected service-account token, a kubeconfig's ``tokenFile``) is re-read as it
rotates (``token.TokenFile``), and a call answered 401 re-reads it and, when it changed,
is retried once.
"""

import asyncio
import json
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import orjson
import yaml

from webhook.cluster.token import TokenFile

JSON_CONTENT: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
DEFAULT_TIMEOUT_S: Final = 10.0
TLS_CLOSE_GRACE_S: Final = 0.25

Obj = dict[str, Any]


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}: {message}")


class ConflictError(ApiError):
    """409: the object changed since it was read (or already exists)."""


class NotFoundError(ApiError):
    """404."""


class GoneError(ApiError):
    """410: a watch's resourceVersion is too old; list again."""


@dataclass(frozen=True)
class Endpoint:
    """Where the API server is and how to authenticate to it."""

    server: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    insecure_skip_verify: bool = False
    # A file holding the token, re-read as it rotates; when set it wins over ``token``.
    token_file: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file and self.key_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


def endpoint_from_kubeconfig(path: str | None, context: str | None = None) -> Endpoint:
    """Read a kubeconfig (path None = in-cluster service account) into an Endpoint."""
    from kubernetes import client, config  # noqa: PLC0415 - only needed at start-up
    from kubernetes.config.incluster_config import SERVICE_TOKEN_FILENAME  # noqa: PLC0415

    configuration = client.Configuration()
    token_file: str | None = None
    if path is None:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        token_file = SERVICE_TOKEN_FILENAME
    else:
        token_file = _kubeconfig_token_file(path, context)
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=configuration
        )
    token = None
    auth = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken")
    if auth:
        token = str(auth).removeprefix("Bearer ").strip()
    return Endpoint(
        server=str(configuration.host),
        ca_file=configuration.ssl_ca_cert,
        cert_file=configuration.cert_file,
        key_file=configuration.key_file,
        token=token,
        insecure_skip_verify=not configuration.verify_ssl,
        token_file=token_file,
    )


def _kubeconfig_token_file(path: str, context: str | None) -> str | None:
    """The ``tokenFile`` of the kubeconfig user the context names (relative to the file), or
    None. The ``kubernetes`` package has already read and validated the file; it reads a
    tokenFile once, which is what this is for."""
    with open(path, encoding="utf-8") as file:
        document: Any = yaml.safe_load(file)
    if not isinstance(document, dict):
        return None
    name = context or document.get("current-context")
    contexts = [c for c in document.get("contexts") or [] if isinstance(c, dict)]
    chosen = next((c.get("context") for c in contexts if c.get("name") == name), None)
    user_name = chosen.get("user") if isinstance(chosen, dict) else None
    users = [u for u in document.get("users") or [] if isinstance(u, dict)]
    user = next((u.get("user") for u in users if u.get("name") == user_name), None)
    token_file = user.get("tokenFile") if isinstance(user, dict) else None
    if not isinstance(token_file, str) or not token_file:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(path)), token_file)


class KubeApi:
    """GET/LIST/WATCH/CREATE/REPLACE/PATCH/DELETE on API paths, returning JSON objects."""

    def __init__(
        self,
        endpoint: Endpoint,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        tokens: TokenFile | None = None,
    ) -> None:
        self._endpoint = endpoint
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        if tokens is None and endpoint.token_file:
            tokens = TokenFile(endpoint.token_file)
        self._tokens = tokens

    async def __aenter__(self) -> "KubeApi":
        headers = {"Accept": JSON_CONTENT}
        if self._endpoint.token and self._tokens is None:
            headers["Authorization"] = f"Bearer {self._endpoint.token}"
        connector = aiohttp.TCPConnector(ssl=self._endpoint.ssl_context(), limit=64)
        self._session = aiohttp.ClientSession(
            base_url=self._endpoint.server.rstrip("/") + "/",
            headers=headers,
            connector=connector,
            timeout=self._timeout,
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            # TLS connections close asynchronously (close_notify): let them finish before the
            # caller's event loop may end, or their sockets are left to the garbage collector.
            await asyncio.sleep(TLS_CLOSE_GRACE_S)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("KubeApi is not open: use 'async with KubeApi(...)'")
        return self._session

    async def get(self, path: str) -> Obj:
        return await self._call("GET", path)

    async def list(self, path: str, **params: str | int) -> Obj:
        return await self._call("GET", path, params=params)

    async def create(self, path: str, body: Mapping[str, Any], *, dry_run: bool = False) -> Obj:
        return await self._call("POST", path, body=body, params=_dry(dry_run))

    async def replace(self, path: str, body: Mapping[str, Any]) -> Obj:
        """PUT: fails with ConflictError when body's metadata.resourceVersion is stale."""
        return await self._call("PUT", path, body=body)

    async def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH) -> Obj:
        return await self._call("PATCH", path, body=body, content_type=content_type)

    async def delete(self, path: str) -> Obj:
        return await self._call("DELETE", path)

    async def watch(
        self, path: str, resource_version: str, timeout_s: int = 300, **params: str | int
    ) -> AsyncIterator[Obj]:
        """Yield watch events ({type, object}) until the server closes the stream."""
        query: dict[str, str | int] = {
            **params,
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_s,
            "allowWatchBookmarks": "true",
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_s + 30)
        for attempt in (1, 2):
            headers, sent = self._auth()
            response = await self.session.get(
                path.lstrip("/"), params=query, timeout=timeout, headers=headers
            )
            if response.status == 401 and attempt == 1 and self._token_renewed(sent):
                response.release()
                continue
            break
        async with response:
            if response.status >= 400:
                raise _error(response.status, await response.text())
            async for line in response.content:
                if not line.strip():
                    continue
                event = orjson.loads(line)  # several times faster than json on every event
                if event.get("type") == "ERROR":
                    status = event.get("object", {})
                    raise _error(int(status.get("code", 500)), json.dumps(status))
                yield event

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str | int] | None = None,
        content_type: str = JSON_CONTENT,
    ) -> Obj:
        data = None if body is None else orjson.dumps(body)
        for attempt in (1, 2):
            headers, sent = self._auth()
            if data is not None:
                headers["Content-Type"] = content_type
            async with self.session.request(
                method, path.lstrip("/"), data=data, params=params, headers=headers
            ) as response:
                raw = await response.read()
                status = response.status
            if status == 401 and attempt == 1 and self._token_renewed(sent):
                continue  # the token rotated under us: once more with the new one
            break
        if status >= 400:
            raise _error(status, raw.decode(errors="replace"))
        result: Obj = orjson.loads(raw) if raw else {}
        return result

    def _auth(self) -> tuple[dict[str, str], str | None]:
        """This request's Authorization header (the token file's current token), and the
        token it sends."""
        if self._tokens is None:
            return {}, None
        token = self._tokens.token()
        return {"Authorization": f"Bearer {token}"}, token

    def _token_renewed(self, sent: str | None) -> bool:
        """After a 401: re-read the token file; whether it holds a token other than the one
        this request sent, to retry with."""
        return self._tokens is not None and sent is not None and self._tokens.renewed_since(sent)


def _dry(dry_run: bool) -> dict[str, str]:
    return {"dryRun": "All"} if dry_run else {}


def _error(status: int, text: str) -> ApiError:
    reason, message = "", text[:500]
    try:
        payload = json.loads(text)
        reason = str(payload.get("reason", ""))
        message = str(payload.get("message", message))
    except (json.JSONDecodeError, AttributeError):
        pass
    kind = {409: ConflictError, 404: NotFoundError, 410: GoneError}.get(status, ApiError)
    return kind(status, reason, message)
