"""A small AdmissionReview client, speaking to the webhook as kube-apiserver does (HTTPS POST).

Used by the demo and the tests; it also builds reviews from pod manifests.
"""

import base64
import io
import json
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from webhook.admission.review import API_VERSION, JSON_CONTENT_TYPE, KIND, Operation


def build_review(
    pod: Mapping[str, Any],
    operation: Operation = "CREATE",
    *,
    username: str = "alice@example.com",
    dry_run: bool = False,
    old: Mapping[str, Any] | None = None,
    uid: str | None = None,
    sub_resource: str = "",
) -> dict[str, Any]:
    """The review kube-apiserver would send for this pod."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": meta.get("namespace", "default"),
        "name": meta.get("name", ""),
        "operation": operation,
        "userInfo": {"username": username, "groups": ["system:authenticated"]},
        "object": dict(pod),
        "oldObject": dict(old) if old is not None else None,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.title()}Options"},
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": API_VERSION, "kind": KIND, "request": request}


def patch_of(review_response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch in an AdmissionReview response ([] when there is none)."""
    response = review_response.get("response") or {}
    encoded = response.get("patch")
    if not encoded:
        return []
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(encoded))
    return ops


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]

    @property
    def response(self) -> dict[str, Any]:
        response: dict[str, Any] = self.body.get("response") or {}
        return response

    @property
    def allowed(self) -> bool:
        return bool(self.response.get("allowed"))

    @property
    def message(self) -> str:
        status = self.response.get("status") or {}
        return str(status.get("message") or self.body.get("message") or "")


def trusting(ca_file: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


_STREAMED_BYTES = 2**20


class WebhookClient:
    """HTTPS client of one webhook; use as ``async with``."""

    def __init__(self, base_url: str, ca_file: Path) -> None:
        self._base = base_url
        self._ssl = trusting(ca_file)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "WebhookClient":
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("use WebhookClient with 'async with'")
        return self._session

    async def post_raw(
        self, path: str, body: bytes, content_type: str = JSON_CONTENT_TYPE
    ) -> Reply:
        # A large body goes as a stream: as raw bytes aiohttp warns that it blocks the loop.
        data = io.BytesIO(body) if len(body) > _STREAMED_BYTES else body
        async with self.session.post(
            self._base + path, data=data, headers={"Content-Type": content_type}, ssl=self._ssl
        ) as response:
            text = await response.text()
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                parsed = {"message": text}
            return Reply(response.status, parsed if isinstance(parsed, dict) else {})

    async def review(self, path: str, review: Mapping[str, Any]) -> Reply:
        return await self.post_raw(path, json.dumps(review).encode())

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self._base + path, ssl=self._ssl) as response:
            return response.status, await response.text()
