"""Polling for the end-to-end agent tests: the agent, kubelet and webhook act on their own
schedule, so a test waits for what it expects, with a deadline and a message."""

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any],
    what: str,
    timeout: float = 60.0,
    denials: list[str] | None = None,
    explain: Callable[[], str] | None = None,
) -> Any:
    """The predicate's first truthy value; on timeout, fail naming ``what``, the last denial
    collected in ``denials`` and whatever ``explain`` adds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    last = f" (last answer: {denials[-1]})" if denials else ""
    more = f"\n{explain()}" if explain is not None else ""
    raise AssertionError(f"timed out waiting for {what}{last}{more}")
