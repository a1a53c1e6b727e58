"""The node's priority boards: one file per GPU that only the agent writes.

Every container's shim announces when it last launched work on each of its GPUs in its
own accounting region (a file only that container can write, in its pod's region volume).
The agent gathers those announcements, with each container's priority taken from the
limits file the agent wrote itself, into one board per GPU in the node directory; a
container sees the boards of its own GPUs, read-only (``agent.boardfiles``).
So no container ever reads what another container wrote: a neighbour cannot truncate,
forge or grow a board, only misreport its own activity (which the agent bounds).

A board says: until when high-priority work holds the GPU (the latest launch of a
high-priority container plus a short hold), and every container's last launch, so a shim
can tell whether it is alone on the GPU (burst, elastic bound). Boards are rewritten in
place (never truncated, never replaced), so a shim that holds one open keeps reading it.
"""

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from agent.boardfiles import BoardFiles, BoardNameError
from agent.hostfiles import AllocationFiles, UntrustedFileError, read_untrusted
from agent.periodic import Periodic
from fracgpu.errors import CodecError
from fracgpu.shim_abi import (
    BOARD_HIGH_HOLD_NS,
    BOARD_MAX_ENTRIES,
    LIMITS_MAX_BYTES,
    PRIORITY_HIGH,
    REGION_HEAD_SIZE,
    REGION_SIZE,
    Board,
    BoardEntry,
    Limits,
    decode_limits,
    decode_region_activity,
    encode_board,
)

log = logging.getLogger(__name__)

# (limits file, where its region is) of one container: the first is the agent's, and the
# region, the container's own, is found from what the limits name (its pod and container).
BoardSource = tuple[Path, Callable[[Limits], Path | None]]


# The agent's own limits file of a container is parsed again at most this often.
_RECHECK_NS = 1_000_000_000


@dataclass(frozen=True)
class _Seen:
    """One container's activity on one GPU, as the agent read it."""

    id: int
    last_active_ns: int
    high: bool


def at(path: Path) -> Callable[[Limits], Path | None]:
    """A region found at ``path`` whatever the limits say (a container's files side by side)."""
    return lambda _limits: path


def allocation_sources(files: AllocationFiles) -> Callable[[], list[BoardSource]]:
    """Every allocation directory of this node (live or not: a stale one is silent)."""

    def sources() -> list[BoardSource]:
        return [(files.limits_path(k), partial(files.region_for, k)) for k in files.all_keys()]

    return sources


class BoardPublisher:
    def __init__(
        self,
        boards: BoardFiles,
        gpus: Callable[[], Iterable[str]],
        sources: Callable[[], Iterable[BoardSource]],
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._boards = boards
        self._gpus = gpus
        self._sources = sources
        self._clock_ns = clock_ns
        self._sequence = 0
        # limits path -> (checked at, limits or None): the agent's own file, parsed once
        # per recheck
        self._limits: dict[Path, tuple[int, Limits | None]] = {}

    def publish(self) -> dict[str, Board]:
        """Read every container's announcement and rewrite every GPU's board."""
        now = self._clock_ns()
        seen: dict[str, list[_Seen]] = {uuid: [] for uuid in self._gpus()}
        limits_used: set[Path] = set()
        regions_used: set[Path] = set()
        for limits_path, region_of in self._sources():
            limits_used.add(limits_path)
            limits = self._read_limits(limits_path, now)
            if limits is None or limits.whole:
                continue
            region_path = region_of(limits)
            # A container holding both canonical resources has two allocations and one
            # region volume: it is one container on the board, not two.
            if region_path is None or region_path in regions_used:
                continue
            regions_used.add(region_path)
            for uuid, item in self._activity(limits, region_path, now):
                if uuid in seen:
                    seen[uuid].append(item)
        for gone in set(self._limits) - limits_used:
            del self._limits[gone]
        self._sequence += 1
        boards = {}
        for uuid, items in seen.items():
            boards[uuid] = board = _board(items, now, self._sequence)
            self._write(uuid, board)
        return boards

    def _read_limits(self, path: Path, now: int) -> Limits | None:
        cached = self._limits.get(path)
        if cached is not None and now - cached[0] < _RECHECK_NS:
            return cached[1]
        limits: Limits | None = None
        try:
            read = read_untrusted(path, LIMITS_MAX_BYTES)
            if read is not None:
                limits = decode_limits(read.data)
        except (UntrustedFileError, CodecError) as error:
            log.warning("limits file skipped for the boards", extra={"error": str(error)})
        self._limits[path] = (now, limits)
        return limits

    def _region_head(self, path: Path) -> bytes | None:
        """The head of a container's region, opened (and checked) and closed again at every
        publication: an open descriptor would keep kubelet from unmounting the pod's region
        volume, and the pod from ever being deleted."""
        read = read_untrusted(path, REGION_SIZE, head=REGION_HEAD_SIZE)
        if read is None or read.size != REGION_SIZE:
            return None
        return read.data

    def _activity(self, limits: Limits, region: Path, now: int) -> list[tuple[str, _Seen]]:
        """Per GPU of the container (in its limits' order): its id and last launch."""
        try:
            head = self._region_head(region)
            if head is None:
                return []
            activity = decode_region_activity(head)
        except (UntrustedFileError, CodecError, OSError):
            return []  # the container's own file is broken: it simply is not seen
        high = limits.priority == PRIORITY_HIGH  # from the agent's file, not the region
        out = []
        for i, dev in enumerate(limits.devices):
            last = activity.active_launch_ns[i] if i < len(activity.active_launch_ns) else 0
            # A stamp from the future is read as "now": it cannot hold the GPU longer.
            out.append((dev.uuid, _Seen(activity.created_ns, min(last, now), high)))
        return out

    def _write(self, uuid: str, board: Board) -> None:
        try:
            # One write of the whole board, in place: never shorter, never replaced.
            self._boards.write(uuid, encode_board(board))
        except (OSError, BoardNameError) as error:
            log.warning("cannot write a board", extra={"gpu": uuid, "error": str(error)})


def _board(items: list[_Seen], now: int, sequence: int) -> Board:
    counts: dict[int, int] = {}
    for item in items:
        counts[item.id] = counts.get(item.id, 0) + 1
    # An id two containers claim identifies neither: it is published as 0, which every
    # reader counts as someone else (a container cannot pose as its neighbour).
    entries = sorted(
        (
            BoardEntry(item.id if counts[item.id] == 1 else 0, item.last_active_ns)
            for item in items
            if item.last_active_ns > 0
        ),
        key=lambda e: e.last_active_ns,
        reverse=True,
    )[:BOARD_MAX_ENTRIES]
    high = max((i.last_active_ns for i in items if i.high and i.last_active_ns > 0), default=0)
    return Board(
        high_active_until_ns=high + BOARD_HIGH_HOLD_NS if high else 0,
        published_ns=now,
        sequence=sequence,
        entries=tuple(entries),
    )


class BoardLoop(Periodic):
    """Publishes the boards every ``interval_seconds`` in a thread of its own."""

    def __init__(self, publisher: BoardPublisher, interval_seconds: float) -> None:
        super().__init__(
            "boards",
            publisher.publish,
            interval_seconds,
            skipped="publishing the boards failed",
            errors=(OSError,),
        )
