"""The edge over real HTTPS: malformed reviews get 4xx, well-formed ones 200 with the UID."""

import json
from typing import Any

import pytest

from tests.webhook.conftest import StartWebhook
from tests.webhook.support import Webhook, gpu_pod, plain_pod
from webhook.cli.client import build_review


def review_with(**request_changes: Any) -> bytes:
    review = build_review(plain_pod())
    for key, value in request_changes.items():
        if value is None:
            review["request"].pop(key, None)
        else:
            review["request"][key] = value
    return json.dumps(review).encode()


MALFORMED = [
    ("not json", b"{not json", "application/json", 400, "body is not JSON"),
    ("not utf-8", b"\xff\xfe\x00", "application/json", 400, "body is not JSON"),
    # Not JSON, though Python's json module reads it.
    ("NaN", b'{"apiVersion": NaN}', "application/json", 400, "body is not JSON"),
    ("json array", b"[1, 2]", "application/json", 400, "must be a JSON object, not list"),
    (
        "wrong apiVersion",
        json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(),
        "application/json",
        400,
        "send apiVersion admission.k8s.io/v1, kind AdmissionReview",
    ),
    (
        "wrong kind",
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}).encode(),
        "application/json",
        400,
        "kind='Pod' is not supported",
    ),
    (
        "no request",
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
        "application/json",
        400,
        "review has no request object",
    ),
    ("no uid", review_with(uid=None), "application/json", 400, "request.uid is missing"),
    ("empty uid", review_with(uid=""), "application/json", 400, "request.uid is missing"),
    (
        "bad operation",
        review_with(operation="PATCH"),
        "application/json",
        400,
        "request.operation='PATCH'",
    ),
    (
        "kind not object",
        review_with(kind="Pod"),
        "application/json",
        400,
        "request.kind must be an object",
    ),
    (
        "object not object",
        review_with(object=[1]),
        "application/json",
        400,
        "request.object must be an object",
    ),
    (
        "no object on create",
        review_with(object=None),
        "application/json",
        400,
        "request.object is missing for CREATE",
    ),
    (
        "dryRun not bool",
        review_with(dryRun="yes"),
        "application/json",
        400,
        "request.dryRun must be true or false",
    ),
    (
        "userInfo not object",
        review_with(userInfo="alice"),
        "application/json",
        400,
        "request.userInfo must be an object",
    ),
    (
        "groups not strings",
        review_with(userInfo={"groups": [1]}),
        "application/json",
        400,
        "groups must be a list of strings",
    ),
    (
        "namespace not string",
        review_with(namespace=7),
        "application/json",
        400,
        "namespace must be a string",
    ),
    ("text/plain", review_with(), "text/plain", 415, "use application/json"),
    ("yaml", review_with(), "application/yaml", 415, "is not supported"),
    ("deep nesting", b"[" * 100 + b"]" * 100, "application/json", 400, "nested deeper than 64"),
]


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("case", "body", "content_type", "status", "message"), MALFORMED, ids=[m[0] for m in MALFORMED]
)
async def test_malformed_reviews_get_4xx_with_a_reason(
    webhook: Webhook,
    *,
    endpoint: str,
    case: str,
    body: bytes,
    content_type: str,
    status: int,
    message: str,
) -> None:
    reply = await webhook.client.post_raw(endpoint, body, content_type)
    assert reply.status == status, (case, reply.body)
    assert reply.body["kind"] == "Status"
    assert message in reply.body["message"]


async def test_body_over_the_cap_gets_413(start: StartWebhook) -> None:
    hook = await start(max_body_bytes="2048")
    small = await hook.client.post_raw("/mutate", review_with())
    assert small.status == 200
    big = build_review(plain_pod())
    big["request"]["object"]["metadata"]["annotations"] = {"note": "x" * 4096}
    reply = await hook.client.post_raw("/mutate", json.dumps(big).encode())
    assert reply.status == 413
    assert "over the limit of 2048 bytes" in reply.body["message"]


async def test_content_type_with_charset_is_accepted(webhook: Webhook) -> None:
    reply = await webhook.client.post_raw(
        "/validate", review_with(), "application/json; charset=utf-8"
    )
    assert reply.status == 200


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
async def test_the_response_echoes_the_request_uid(webhook: Webhook, endpoint: str) -> None:
    for pod in (plain_pod(), gpu_pod({"tencent.com/vcuda-core": "150"})):
        review = build_review(pod, uid="uid-4242-" + endpoint)
        reply = await webhook.client.review(endpoint, review)
        assert reply.status == 200
        assert reply.body["apiVersion"] == "admission.k8s.io/v1"
        assert reply.body["kind"] == "AdmissionReview"
        assert reply.response["uid"] == "uid-4242-" + endpoint


async def test_a_bad_pod_is_a_200_denial_not_an_http_error(webhook: Webhook) -> None:
    reply = await webhook.client.review(
        "/mutate", build_review(gpu_pod({"tencent.com/vcuda-core": "150"}))
    )
    assert reply.status == 200
    assert reply.allowed is False
    assert reply.response["status"]["code"] == 422
    assert "tencent.com/vcuda-core=150 is not allowed" in reply.message


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
async def test_other_operations_are_allowed_untouched(webhook: Webhook, operation: str) -> None:
    review = build_review(gpu_pod({"tencent.com/vcuda-core": "150"}), operation)
    for endpoint in ("/mutate", "/validate"):
        reply = await webhook.client.review(endpoint, review)
        assert reply.allowed
        assert "patch" not in reply.response


async def test_objects_other_than_pods_are_allowed_untouched(webhook: Webhook) -> None:
    review = build_review(gpu_pod({"tencent.com/vcuda-core": "150"}))
    review["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    for endpoint in ("/mutate", "/validate"):
        reply = await webhook.client.review(endpoint, review)
        assert reply.allowed
        assert "patch" not in reply.response


async def test_get_on_an_admission_endpoint_is_405(webhook: Webhook) -> None:
    status, _ = await webhook.client.get("/mutate")
    assert status == 405


async def test_health_and_readiness(webhook: Webhook) -> None:
    assert await webhook.client.get("/healthz") == (200, "ok")
    assert await webhook.client.get("/readyz") == (200, "ok")
