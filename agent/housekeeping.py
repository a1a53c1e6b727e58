"""Housekeeping: remove the allocation directories of containers that are gone.

A directory goes once no live container has owned it for the whole grace period, as this
agent saw it in kubelet's pod-resources answers (and at least two sweeps in a row), and it
is itself older than the grace period. One answer without the container is not enough:
right after a kubelet restart, pod-resources answers before kubelet has read its pods back,
so a container that is still running can be missing from it for a moment; and a directory
Allocate has just made belongs to no container until kubelet records the allocation. A
restarted agent starts counting afresh, so a restart never makes a directory removable
sooner.
"""

import time
from collections.abc import Callable, Iterable

from agent.containers import remove_stale
from agent.hostfiles import AllocationFiles


class Housekeeper:
    def __init__(
        self,
        files: AllocationFiles,
        grace_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._files = files
        self._grace = grace_seconds
        self._clock = clock
        self._missing_since: dict[str, float] = {}

    def sweep(self, live: Iterable[str]) -> list[str]:
        """Remove what has been unowned for the grace period; returns the removed keys."""
        now = self._clock()
        keep = set(live)
        present = set(self._files.all_keys())
        missing = present - keep
        self._missing_since = {key: self._missing_since.get(key, now) for key in sorted(missing)}
        unowned_long = {
            key
            for key, since in self._missing_since.items()
            if since < now and now - since >= self._grace  # seen missing before, too
        }
        removed = remove_stale(self._files, present - unowned_long, self._grace)
        for key in removed:
            self._missing_since.pop(key, None)
        return removed
