"""The extender's edges (issue 21): what reaches it, and what it refuses before deciding.

The routes bind pods, so: the loopback app is the only plain-HTTP door, the relay route on
the HTTPS port answers only calls signed with the replicas' shared key (fresh, unchanged),
bodies are bounded, and malformed calls get a clear 400. Decisions themselves run against
a real API server in tests/e2e/test_queue_e2e.py.
"""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from tests.webhook.support import cluster_state, write_tls
from webhook.queue.extender import RELAY_PREFIX, Extender, add_relay_routes, loopback_app
from webhook.queue.keys import SharedKey
from webhook.queue.scheduler import QueueScheduler

LIMIT = 4096


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    _, _, _, key = write_tls(tmp_path)
    return key


def extender(key_file: Path, clock: float = 1000.0) -> Extender:
    # No scheduler: every call here is refused before a decision is needed.
    return Extender(
        cluster_state(),
        cast(QueueScheduler, None),
        SharedKey(key_file, "fracgpu extender relay"),
        max_body_bytes=LIMIT,
        clock=lambda: clock,
    )


@pytest.fixture
async def served(key_file: Path) -> AsyncIterator[tuple[str, Extender]]:
    ext = extender(key_file)
    app = loopback_app(ext)
    add_relay_routes(app, ext)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", ext
    await runner.cleanup()


async def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers=headers or {}) as answer,
    ):
        return answer.status, await answer.json(content_type=None)


async def test_bodies_over_the_limit_are_refused_with_the_limit_named(
    served: tuple[str, Extender],
) -> None:
    url, _ = served
    status, body = await post(f"{url}/filter", b"{" + b" " * LIMIT + b"}")
    assert status == 413
    assert str(LIMIT) in body["error"]


@pytest.mark.parametrize("payload", [b"not json", b"[]", b'{"pod": 1, "nodenames": []}'])
async def test_malformed_calls_get_a_clear_400(
    served: tuple[str, Extender], payload: bytes
) -> None:
    url, _ = served
    status, body = await post(f"{url}/filter", payload)
    assert status == 400
    assert body["error"]


async def test_bind_args_must_name_the_pod_and_node(served: tuple[str, Extender]) -> None:
    url, _ = served
    status, body = await post(f"{url}/bind", b'{"podName": "p", "podNamespace": "team"}')
    assert status == 200
    assert "ExtenderBindingArgs.node" in body["error"]


async def test_relayed_calls_must_be_signed_by_a_replica(
    served: tuple[str, Extender], key_file: Path, tmp_path: Path
) -> None:
    url, ext = served
    body = b'{"podName": "p", "podNamespace": "team"}'
    relay = f"{url}{RELAY_PREFIX}bind"
    status, answer = await post(relay, body)
    assert status == 403, "unsigned"
    assert "signed" in answer["error"]
    signed = ext.sign("bind", body)
    status, answer = await post(relay, body, signed)
    assert status == 200, "signed by a replica: reaches the bind (which names what is missing)"
    assert "ExtenderBindingArgs.node" in answer["error"]
    status, _ = await post(relay, body + b" ", signed)
    assert status == 403, "body changed after signing"
    status, _ = await post(f"{url}{RELAY_PREFIX}filter", body, signed)
    assert status == 403, "signature of another verb"
    old = extender(key_file, clock=1000.0 - 60).sign("bind", body)
    status, _ = await post(relay, body, old)
    assert status == 403, "stale: replayed later"
    _, _, _, other_key = write_tls(tmp_path / "other")
    stranger = extender(other_key).sign("bind", body)
    status, _ = await post(relay, body, stranger)
    assert status == 403, "made with another key (not this cluster's replicas)"


def test_the_shared_key_follows_a_rotated_serving_key(key_file: Path, tmp_path: Path) -> None:
    key = SharedKey(key_file, "purpose")
    before = key.current()
    assert SharedKey(key_file, "purpose").current() == before, "replicas derive the same"
    assert SharedKey(key_file, "other").current() != before, "one key per purpose"
    _, _, _, rotated = write_tls(tmp_path / "rotated")
    key_file.write_bytes(rotated.read_bytes() + b"\n")
    assert key.current() != before
    assert key.accepted() == (key.current(), before)
