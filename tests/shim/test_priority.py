"""Priority: a low-priority container does not slow a high-priority one.

Both containers share one simulated GPU (the driver double's device timeline)
and the node's priority board directory; neither has a compute limit.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from fracgpu import shim_abi
from tests.shim.sandbox import UUIDS, GiB, Sandbox, step


def container(node: Sandbox, name: str, priority: int) -> tuple[Path, Path]:
    root = node.root / name
    root.mkdir()
    limits = shim_abi.Limits(
        devices=(shim_abi.DeviceLimits(UUIDS[0], GiB, 100),), priority=priority
    )
    (root / "limits").write_bytes(shim_abi.encode_limits(limits))
    return root / "limits", root / "region"


def launches(node: Sandbox, limits: Path, region: Path, seconds: str) -> subprocess.Popen[str]:
    return node.start(
        "launch_ops",
        "2000",
        seconds,
        "launch",
        region=region,
        extra={"FRACGPU_TEST_LIMITS_PATH": str(limits)},
    )


def busy(proc: subprocess.Popen[str]) -> float:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    return float(step(out, "launch")[3])


def contend(node: Sandbox) -> tuple[float, float, float]:
    high = container(node, "high", shim_abi.PRIORITY_HIGH)
    low = container(node, "low", shim_abi.PRIORITY_LOW)
    alone = busy(launches(node, *high, "1"))
    both = [launches(node, *high, "1.5"), launches(node, *low, "1.5")]
    return alone, busy(both[0]), busy(both[1])


def test_high_priority_keeps_its_throughput_next_to_low_priority(node: Sandbox) -> None:
    node.publish_boards()
    alone, high, low = contend(node)
    assert high >= 0.9 * alone, (alone, high, low)
    assert low < 0.2, (alone, high, low)
    board = shim_abi.decode_board((node.node_dir / UUIDS[0]).read_bytes())
    assert board.high_active_until_ns > 0  # published by the agent from the high one's region


def test_without_a_priority_board_they_share(node: Sandbox) -> None:
    alone, high, low = contend(node)  # no node directory: no priority
    assert high < 0.75 * alone, (alone, high, low)
    assert low > 0.25, (alone, high, low)


def sliced(
    node: Sandbox, name: str, priority: int, core_max: int | None = None
) -> tuple[Path, Path]:
    root = node.root / name
    root.mkdir()
    limits = shim_abi.Limits(
        devices=(shim_abi.DeviceLimits(UUIDS[0], GiB, 50, core_max),),
        priority=priority,
        burst_when_alone=core_max is not None,
    )
    (root / "limits").write_bytes(shim_abi.encode_limits(limits))
    return root / "limits", root / "region"


def test_priority_never_takes_a_neighbours_requested_share(node: Sandbox) -> None:
    """Two containers at 50 % each; the high-priority one may burst to 100 %: the
    low-priority one, with work queued all the time, keeps at least 45 %."""
    node.publish_boards()
    high = sliced(node, "high", shim_abi.PRIORITY_HIGH, core_max=100)
    low = sliced(node, "low", shim_abi.PRIORITY_LOW)
    both = [launches(node, *high, "3"), launches(node, *low, "3")]
    high_share, low_share = busy(both[0]), busy(both[1])
    assert low_share >= 0.45, (high_share, low_share)
    assert high_share >= 0.45, (high_share, low_share)


# ---- the board is read as hostile input: truncated, garbage, forged ----


def _overwrite_board(node: Sandbox, data: bytes) -> None:
    """Replace the board's content in place (the same file the shim holds open)."""
    path = node.node_dir / UUIDS[0]
    with path.open("r+b") as f:
        f.truncate(len(data))
        f.write(data)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "shrink_to_header"])
def test_a_damaged_board_never_crashes_or_stalls_a_container(node: Sandbox, damage: str) -> None:
    """A board truncated or overwritten under a running container: no SIGBUS (the board
    is never mapped), no stall; the container keeps running at its slice."""
    node.publish_boards()
    low = container(node, "low", shim_abi.PRIORITY_LOW)
    proc = launches(node, *low, "2")
    time.sleep(0.7)  # launching, with the board open
    node.stop_boards()
    path = node.node_dir / UUIDS[0]
    if damage == "truncate":
        os.truncate(path, 0)
    elif damage == "garbage":
        _overwrite_board(node, os.urandom(shim_abi.BOARD_SIZE))
    else:
        _overwrite_board(node, path.read_bytes()[:64])
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert float(step(out, "launch")[3]) >= 0.9


def test_a_forged_high_priority_stamp_cannot_stall_a_container(node: Sandbox) -> None:
    """A board claiming high-priority work for the next hour: a best-effort container waits
    at most the hold past the board's publication, then runs."""
    node.node_dir.mkdir()
    now = time.monotonic_ns()
    forged = shim_abi.encode_board(
        shim_abi.Board(high_active_until_ns=now + 3600 * 10**9, published_ns=now, sequence=1)
    )
    (node.node_dir / UUIDS[0]).write_bytes(forged)
    low = container(node, "low", shim_abi.PRIORITY_LOW)
    started = time.monotonic()
    proc = launches(node, *low, "1")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, out + err
    assert time.monotonic() - started < 5
    assert float(step(out, "launch")[3]) >= 0.9


def test_best_effort_work_never_takes_a_neighbours_requested_share(node: Sandbox) -> None:
    """A best-effort container (no reserved compute, unpaced) saturating the GPU next to a
    50 % container: the 50 % one keeps at least 45 %; the best-effort one gets the rest."""
    node.publish_boards()
    paced = sliced(node, "paced", shim_abi.PRIORITY_LOW)
    root = node.root / "best-effort"
    root.mkdir()
    (root / "limits").write_bytes(
        shim_abi.encode_limits(
            shim_abi.Limits(
                devices=(shim_abi.DeviceLimits(UUIDS[0], GiB, 50),), compute_limit_enabled=False
            )
        )
    )
    # The best-effort one starts first: a backlog it queued alone must not hold the other back.
    both = [launches(node, root / "limits", root / "region", "3"), launches(node, *paced, "3")]
    best_effort_share, paced_share = busy(both[0]), busy(both[1])
    assert paced_share >= 0.45, (paced_share, best_effort_share)
    assert best_effort_share >= 0.3, (paced_share, best_effort_share)  # work-conserving
