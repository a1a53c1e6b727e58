"""Raw-byte fuzzing of the review endpoints over HTTPS: random bytes, and valid reviews with
bytes flipped, cut or spliced. Whatever arrives, the answer is a clean 4xx or a 200 review
response, never a 500 or a dropped connection.

CI runs ``FUZZ_EXAMPLES`` per test; ``FRACGPU_FUZZ_EXAMPLES=N`` runs longer on demand. The
number of inputs sent is printed (``-s``) for docs/benchmarks.md.
"""

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.webhook.support import Webhook, gpu_pod
from webhook.admission.review import JSON_CONTENT_TYPE
from webhook.cli.client import build_review
from webhook.serving import server

FUZZ_EXAMPLES = int(os.environ.get("FRACGPU_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
VALID = json.dumps(
    build_review(gpu_pod({"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"}))
).encode()


@pytest.fixture(scope="module")
def sent() -> Iterator[dict[str, int]]:
    counts = {"inputs": 0}
    yield counts
    print(f"\nraw-byte fuzzing: {counts['inputs']} inputs sent to /mutate and /validate")


async def _post_everywhere(
    webhook: Webhook, body: bytes, sent: dict[str, int], content_type: str = JSON_CONTENT_TYPE
) -> None:
    for endpoint in ("/mutate", "/validate"):
        reply = await webhook.client.post_raw(endpoint, body, content_type)
        sent["inputs"] += 1
        assert reply.status in (200, 400, 413, 415), (reply.status, reply.body, body[:200])
        if reply.status != 200:
            assert reply.body.get("message"), reply.body  # every refusal says why
            continue
        response: Any = reply.body.get("response")
        assert isinstance(response, dict), reply.body
        assert response.get("status", {}).get("code") != 500, response
        if not response["allowed"]:
            assert response["status"]["message"], response


@FUZZ
@given(body=st.binary(max_size=2048))
async def test_random_bytes_get_a_clean_answer(
    webhook: Webhook, sent: dict[str, int], body: bytes
) -> None:
    await _post_everywhere(webhook, body, sent)


@FUZZ
@given(data=st.data())
async def test_damaged_reviews_get_a_clean_answer(
    webhook: Webhook, sent: dict[str, int], data: st.DataObject
) -> None:
    body = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 8), label="damages")):
        kind = data.draw(st.sampled_from(["flip", "cut", "splice", "insert"]), label="kind")
        at = data.draw(st.integers(0, max(0, len(body) - 1)), label="at")
        if kind == "flip" and body:
            body[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        elif kind == "cut":
            del body[at : at + data.draw(st.integers(1, 64), label="length")]
        elif kind == "splice":
            start = data.draw(st.integers(0, len(VALID) - 1), label="from")
            body[at:at] = VALID[start : start + data.draw(st.integers(1, 64), label="length")]
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=16), label="bytes")
    await _post_everywhere(webhook, bytes(body), sent)


@FUZZ
@given(
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/json; charset=latin-1", "", "*/*"]
    ),
    body=st.sampled_from([VALID, b"{}", b""]),
)
async def test_any_content_type_gets_a_clean_answer(
    webhook: Webhook, sent: dict[str, int], content_type: str, body: bytes
) -> None:
    await _post_everywhere(webhook, body, sent, content_type)


LARGE = json.dumps(
    build_review(
        gpu_pod(
            {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"},
            env=[{"name": f"E{i}", "value": "x" * 40} for i in range(3000)],  # over 2048
        )
    )
).encode()


def screened(webhook: Webhook) -> int:
    app = webhook.running.runner.app
    assert app is not None
    return app[server.SCREENER].screened


@settings(
    max_examples=max(FUZZ_EXAMPLES // 10, 10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_damaged_large_reviews_are_screened_and_get_a_clean_answer(
    webhook: Webhook, sent: dict[str, int], data: st.DataObject
) -> None:
    """Bodies over the screening size (a pod over a limit, damaged) are read by the worker
    process, whatever the damage; the answer is as clean as for small ones."""
    body = bytearray(LARGE)
    for _ in range(data.draw(st.integers(0, 6), label="damages")):
        at = data.draw(st.integers(0, len(body) - 1), label="at")
        if data.draw(st.booleans(), label="flip"):
            body[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        else:
            del body[at : at + data.draw(st.integers(1, 64), label="length")]
    before = screened(webhook)
    await _post_everywhere(webhook, bytes(body), sent)
    assert screened(webhook) == before + 2
