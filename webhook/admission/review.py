"""The AdmissionReview wire format (admission.k8s.io/v1) and its strict parsing.

Two error channels, never mixed up:

- the review itself is malformed (not JSON, wrong apiVersion/kind, no request, no UID, body
  over the cap, wrong content type): ``MalformedReviewError`` -> an HTTP 4xx answer, because there
  is no request to answer to;
- the review is well formed but the pod in it is bad: that is an admission answer (HTTP 200,
  ``allowed: false``), decided by the rules, not here.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, NotRequired, TypedDict

import orjson

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
JSON_CONTENT_TYPE: Final = "application/json"
# kube-apiserver caps an object at 3 MiB; a review may carry the object and oldObject twice.
DEFAULT_MAX_BODY_BYTES: Final = 8 * 1024 * 1024
# Deeply nested JSON is an attack, not a pod; Python's parser would recurse through it.
MAX_NESTING: Final = 64

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
OPERATIONS: Final = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]


class StatusResult(TypedDict, total=False):
    code: int
    message: str
    reason: str


class AdmissionResponseBody(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[StatusResult]
    patchType: NotRequired[Literal["JSONPatch"]]
    patch: NotRequired[str]
    warnings: NotRequired[list[str]]


class AdmissionReviewResponse(TypedDict):
    apiVersion: str
    kind: str
    response: AdmissionResponseBody


class MalformedReviewError(Exception):
    """The HTTP request is not a usable AdmissionReview; answered with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"{status}: {message}")


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """The parts of a review's request that admission uses, type-checked."""

    uid: str
    operation: Operation
    kind: GroupVersionKind
    namespace: str
    name: str
    username: str
    groups: tuple[str, ...]
    dry_run: bool
    sub_resource: str
    obj: dict[str, Any] | None
    old_obj: dict[str, Any] | None = None

    @property
    def is_pod(self) -> bool:
        kind = self.kind
        return kind["kind"] == "Pod" and kind["version"] == "v1" and kind["group"] == ""


def parse_review(
    body: bytes, content_type: str, max_body_bytes: int, *, check_depth: bool = True
) -> AdmissionRequest:
    """Parse an HTTP body into a request, or raise ``MalformedReviewError`` saying what is wrong.
    ``check_depth=False`` only for a body whose depth was checked already
    (``webhook.serving.screen``)."""
    document = load_review(body, content_type, max_body_bytes)
    if check_depth:
        check_nesting(body, document)
    return read_request(document)


def load_review(body: bytes, content_type: str, max_body_bytes: int) -> object:
    """The body's JSON document, after its content type and size are checked."""
    if content_type.split(";", maxsplit=1)[0].strip().lower() != JSON_CONTENT_TYPE:
        raise MalformedReviewError(
            415,
            f"content type {content_type or '(none)'!r} is not supported: use {JSON_CONTENT_TYPE}",
        )
    if len(body) > max_body_bytes:
        raise MalformedReviewError(
            413, f"body of {len(body)} bytes is over the limit of {max_body_bytes} bytes"
        )
    try:
        # orjson: several times faster than json. Unlike json it refuses NaN and lone
        # surrogates (not JSON) and reads integers past 64 bits as floats (no pod has them).
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise MalformedReviewError(400, f"body is not JSON: {error}") from None


def check_nesting(body: bytes, document: object) -> None:
    """Refuse a document nested deeper than ``MAX_NESTING`` (``body`` is its text)."""
    if _may_nest_deeper(body, MAX_NESTING) and _depth_exceeds(document, MAX_NESTING):
        raise MalformedReviewError(400, f"body is nested deeper than {MAX_NESTING} levels")


def read_request(document: object) -> AdmissionRequest:
    """The request of a review document, its shape checked."""
    if not isinstance(document, dict):
        raise MalformedReviewError(
            400, f"body must be a JSON object, not {type(document).__name__}"
        )
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        raise MalformedReviewError(
            400,
            f"apiVersion={document.get('apiVersion')!r} kind={document.get('kind')!r} "
            f"is not supported: send apiVersion {API_VERSION}, kind {KIND}",
        )
    request = document.get("request")
    if not isinstance(request, dict):
        raise MalformedReviewError(400, "review has no request object")
    return _parse_request(request)


def _parse_request(request: dict[str, Any]) -> AdmissionRequest:
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReviewError(400, "request.uid is missing: it must be a non-empty string")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise MalformedReviewError(
            400, f"request.operation={operation!r} is not one of {', '.join(OPERATIONS)}"
        )
    kind = _gvk(request.get("kind"))
    user = request.get("userInfo") or {}
    if not isinstance(user, dict):
        raise MalformedReviewError(400, "request.userInfo must be an object")
    groups = user.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise MalformedReviewError(400, "request.userInfo.groups must be a list of strings")
    dry_run = request.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise MalformedReviewError(400, "request.dryRun must be true or false")
    obj = _optional_object(request, "object")
    old_obj = _optional_object(request, "oldObject")
    if operation in ("CREATE", "UPDATE") and obj is None:
        raise MalformedReviewError(400, f"request.object is missing for {operation}")
    return AdmissionRequest(
        uid=uid,
        operation=operation,
        kind=kind,
        namespace=_string(request, "namespace"),
        name=_string(request, "name"),
        username=_string(user, "username"),
        groups=tuple(groups),
        dry_run=dry_run,
        sub_resource=_string(request, "subResource"),
        obj=obj,
        old_obj=old_obj,
    )


def _gvk(raw: object) -> GroupVersionKind:
    if not isinstance(raw, dict):
        raise MalformedReviewError(
            400, "request.kind must be an object with group, version and kind"
        )
    group, version, kind = raw.get("group", ""), raw.get("version", ""), raw.get("kind", "")
    if type(group) is not str or type(version) is not str or type(kind) is not str:
        raise MalformedReviewError(400, "request.kind group, version and kind must be strings")
    return {"group": group, "version": version, "kind": kind}


def _optional_object(request: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise MalformedReviewError(
            400, f"request.{key} must be an object, not {type(value).__name__}"
        )
    return value


def _string(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key) or ""
    if not isinstance(value, str):
        raise MalformedReviewError(400, f"{key} must be a string, not {type(value).__name__}")
    return value


def _may_nest_deeper(body: bytes, limit: int) -> bool:
    """Whether the document could nest deeper than ``limit``: not when it has no more than
    ``limit`` opening brackets in all (strings included), the usual case, counted in C."""
    return body.count(b"{") + body.count(b"[") > limit


def _depth_exceeds(value: object, limit: int) -> bool:
    """Iterative depth check, so a hostile document cannot exhaust the stack here either."""
    if not isinstance(value, dict | list):
        return limit < 0
    stack: list[tuple[dict[str, object] | list[object], int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item and depth >= limit:
            return True  # its members are deeper than the limit
        # Only objects and arrays are pushed: most members are strings and numbers.
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False
