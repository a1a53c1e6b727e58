"""Fixtures: a real HTTPS webhook on 127.0.0.1, and a check that no asyncio task leaks."""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.webhook.support import Webhook, cluster_state, start_webhook, stop_webhook
from webhook.state.embedded import EmbeddedState


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running (set up first, so it checks last)."""
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)
    leaked = [
        task
        for task in asyncio.all_tasks() - before
        if task is not asyncio.current_task() and not task.done()
    ]
    for task in leaked:
        task.cancel()
    assert not leaked, f"test leaked asyncio tasks: {leaked}"


StartWebhook = Callable[..., Awaitable[Webhook]]


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[StartWebhook]:
    """Start webhooks (own state and settings each); all are stopped after the test."""
    started: list[Webhook] = []

    async def launch(state: EmbeddedState | None = None, **overrides: Any) -> Webhook:
        directory = tmp_path / f"tls{len(started)}"
        hook = await start_webhook(directory, state or cluster_state(), **overrides)
        started.append(hook)
        return hook

    yield launch
    for hook in started:
        await stop_webhook(hook)


@pytest.fixture
async def webhook(start: StartWebhook) -> Webhook:
    return await start()
