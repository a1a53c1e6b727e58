"""The loaded state is frozen out of full collections, only once it is ready."""

import asyncio
import gc
from collections.abc import Iterator

import pytest

from webhook.gcpause import freeze_when_ready


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # other tests expect a normal collector


async def test_freezes_what_is_alive_once_ready_and_not_before(unfrozen: None) -> None:
    ready = asyncio.Event()
    loaded = [{"record": i} for i in range(10_000)]  # long-lived state
    task = asyncio.create_task(freeze_when_ready(ready.is_set, poll_s=0.01))
    await asyncio.sleep(0.05)
    assert gc.get_freeze_count() == 0 and not task.done()
    ready.set()
    await asyncio.wait_for(task, 2)
    assert gc.get_freeze_count() >= len(loaded)
    assert all(gc.is_tracked(r) for r in loaded[:3])
