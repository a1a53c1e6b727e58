"""The loaded state is frozen out of full collections, only once it is ready."""

import asyncio
import gc
from collections.abc import Iterator

import pytest

from webhook.serving.gcpause import freeze_when_ready


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # other tests expect a normal collector


async def test_freezes_what_is_alive_once_ready_and_not_before(unfrozen: None) -> None:
    ready = asyncio.Event()
    loaded = [[i] for i in range(1_000)]  # long-lived state (lists are always tracked)

    def collected_normally() -> int:
        """How many of ``loaded`` a full collection still walks."""
        walked = {id(o) for o in gc.get_objects()}
        return sum(id(r) in walked for r in loaded)

    task = asyncio.create_task(freeze_when_ready(ready.is_set, poll_s=0.01))
    await asyncio.sleep(0.05)
    assert gc.get_freeze_count() == 0 and not task.done()
    assert collected_normally() == len(loaded)
    ready.set()
    await asyncio.wait_for(task, 2)
    assert gc.get_freeze_count() >= len(loaded)
    assert collected_normally() == 0
