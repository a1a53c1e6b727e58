"""One reconciliation: read, decide, write; on a conflict, read again and decide again."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from .errors import StoreConflictError, StoreError
from .policy import Decision, carry_out, decide, next_due
from .settings import Settings
from .store import KubeStore, Write

log = logging.getLogger("fracgpu.certs")

MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    writes: tuple[Write, ...]
    attempts: int
    next_due: datetime | None

    def summary(self) -> str:
        writes = ", ".join(map(str, self.writes)) or "no writes"
        return f"{self.decision.summary()} ({writes})"


def ensure(
    store: KubeStore,
    settings: Settings,
    clock: Callable[[], datetime],
    max_attempts: int = MAX_ATTEMPTS,
) -> Outcome:
    """Bring the stored certificates and caBundles to what the policy wants, once."""
    for attempt in range(1, max_attempts + 1):
        snapshot = store.read()
        now = clock()
        decision = decide(snapshot.state, settings, now)
        desired = carry_out(decision, snapshot.state, settings, now)
        try:
            writes = store.write(snapshot, desired)
        except StoreConflictError as conflict:
            log.info("conflict (attempt %d/%d), re-reading: %s", attempt, max_attempts, conflict)
            continue
        return Outcome(decision, writes, attempt, next_due(desired, settings))
    raise StoreError(
        f"gave up after {max_attempts} attempts: the objects kept changing between our read "
        "and our write (is another writer fighting over them?)"
    )
