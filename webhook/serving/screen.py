"""Large reviews are screened in a worker process before the event loop parses them.

Parsing a review and checking its pod against ``podbounds`` is linear in its size, but a
review of a few MB still costs tens of milliseconds of CPU, and the event loop answers every
other review meanwhile. A review larger than ``screen_body_bytes`` is therefore parsed and
checked first in a worker process: a malformed review or a pod over a limit is answered from
the worker's small result, and the loop never parses it; only a review that passes is parsed
again on the loop (its depth already checked). At most ``screen_workers`` large reviews are
read and screened at once: the others wait before their bodies are read, so memory stays
bounded too. The pool starts with the first large review, and a worker that dies is
replaced for the next one.
"""

import asyncio
import dataclasses
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from webhook.admission.review import (
    AdmissionRequest,
    MalformedReviewError,
    check_nesting,
    load_review,
    read_request,
)
from webhook.rules import podbounds


@dataclass(frozen=True, slots=True)
class Screened:
    """A worker's finding: the review is malformed (``status``, ``message``), or its pod is
    over a limit (``problem``, with the request read without its objects), or neither."""

    status: int = 0
    message: str = ""
    request: AdmissionRequest | None = None
    problem: str = ""

    @property
    def malformed(self) -> MalformedReviewError | None:
        return MalformedReviewError(self.status, self.message) if self.status else None


class ScreenUnavailableError(Exception):
    """The worker process died while screening; the review was not answered."""


def screen(
    body: bytes, content_type: str, max_body_bytes: int, limits: podbounds.PodLimits
) -> Screened:
    """Runs in the worker: parse the review and check its pod (picklable in and out)."""
    try:
        # The limits first: they walk no deeper than a pod's fixed fields, and a pod over one
        # is answered without the nesting check's walk of every value (most of the cost).
        document = load_review(body, content_type, max_body_bytes)
        request = read_request(document)
        problem = podbounds.problem(request.obj, limits) if request.obj is not None else None
        if not problem:
            check_nesting(body, document)
            return Screened()
    except MalformedReviewError as error:
        return Screened(status=error.status, message=error.message)
    return Screened(
        request=dataclasses.replace(request, obj=None, old_obj=None, namespace=_namespace(request)),
        problem=problem,
    )


def _namespace(request: AdmissionRequest) -> str:
    """The review's namespace, else the pod's own (as admission reads it)."""
    meta = request.obj.get("metadata") if request.obj else None
    from_pod = meta.get("namespace") if isinstance(meta, dict) else None
    return request.namespace or (from_pod if isinstance(from_pod, str) else "")


class Screener:
    """The worker pool and the slots that bound how many large reviews are in flight."""

    def __init__(self, workers: int, limits: podbounds.PodLimits, max_body_bytes: int) -> None:
        self._workers = workers
        self._limits = limits
        self._max_body_bytes = max_body_bytes
        self._pool: ProcessPoolExecutor | None = None
        self.slots = asyncio.Semaphore(workers)
        self.screened = 0  # reviews screened so far

    async def screen(self, body: bytes, content_type: str) -> Screened:
        if self._pool is None:
            # spawn: a fresh interpreter, not a fork of this threaded, event-looped process
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(self._workers, mp_context=context)
        loop = asyncio.get_running_loop()
        self.screened += 1
        try:
            return await loop.run_in_executor(
                self._pool, screen, body, content_type, self._max_body_bytes, self._limits
            )
        except BrokenProcessPool as error:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            raise ScreenUnavailableError(
                f"the worker screening large reviews died: {error}"
            ) from None

    def worker_pids(self) -> list[int]:
        """Process IDs of the running workers (none before the first large review)."""
        processes = getattr(self._pool, "_processes", None) or {}
        return [int(pid) for pid in processes]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
