"""Node-shared files: the boards only the agent writes, from files each container owns.

Every container-writable input here is hostile: a region that is truncated, a symbolic
link, a FIFO, a huge file, garbage, or full of absurd values, and a neighbour posing as
another container or as high priority. The agent must neither hang, nor trust it.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.boardfiles import BoardFiles
from agent.boards import BoardPublisher, BoardSource, allocation_sources, at
from agent.containers import LiveContainer, live_containers
from agent.hostfiles import AllocationFiles, allocation_key
from agent.podresources import ContainerDevices
from fracgpu import shim_abi
from tests.agent.regionvolume import region_in_volume
from tests.shimregion import blank_region

GPU = "GPU-fa4e0000-0000-4000-8000-000000000000"
NOW = 10_000_000_000_000
HOUR = 3600 * 10**9


def _limits(priority: int = shim_abi.PRIORITY_LOW) -> bytes:
    return shim_abi.encode_limits(
        shim_abi.Limits(devices=(shim_abi.DeviceLimits(GPU, 1 << 30, 50),), priority=priority)
    )


def _region(created_ns: int, active_ns: int, devices: int = 1) -> bytes:
    # A region may claim anything: only the limits count.
    buf = blank_region(devices, priority=shim_abi.PRIORITY_HIGH)
    struct.pack_into("<Q", buf, shim_abi.HDR_OFF_CREATED_NS, created_ns)
    for i in range(devices):
        base = shim_abi.DEVICES_OFF + i * shim_abi.DEV_SIZE
        struct.pack_into("<Q", buf, base + shim_abi.DEV_OFF_ACTIVE_LAUNCH_NS, active_ns)
    return bytes(buf)


class Node:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.node_dir = root / "node"
        self.node_dir.mkdir()
        self.containers: list[BoardSource] = []

    def container(self, name: str, limits: bytes, region: bytes | None) -> Path:
        d = self.root / name
        d.mkdir()
        (d / "limits").write_bytes(limits)
        if region is not None:
            (d / "region").write_bytes(region)
        self.containers.append((d / "limits", at(d / "region")))
        return d / "region"

    def publisher(self) -> BoardPublisher:
        return BoardPublisher(
            BoardFiles(self.node_dir), lambda: [GPU], lambda: self.containers, lambda: NOW
        )

    def board(self) -> shim_abi.Board:
        return shim_abi.decode_board((self.node_dir / GPU).read_bytes())


def _within(seconds: float, work: Callable[[], object]) -> None:
    done = threading.Event()

    def run() -> None:
        work()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(seconds), "blocked on a container's file"


def test_the_board_carries_each_container_and_high_priority_from_the_limits(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    node.container("high", _limits(shim_abi.PRIORITY_HIGH), _region(11, NOW - 5_000_000))
    node.container("low", _limits(), _region(22, NOW - 1_000_000))
    node.publisher().publish()
    board = node.board()
    assert board.published_ns == NOW
    assert board.high_active_until_ns == NOW - 5_000_000 + shim_abi.BOARD_HIGH_HOLD_NS
    assert set(board.entries) == {
        shim_abi.BoardEntry(11, NOW - 5_000_000),
        shim_abi.BoardEntry(22, NOW - 1_000_000),
    }
    assert (node.node_dir / GPU).stat().st_size == shim_abi.BOARD_SIZE


def test_a_low_priority_region_cannot_stamp_the_gpu_busy(tmp_path: Path) -> None:
    node = Node(tmp_path)
    # claims high priority in its region header and activity an hour ahead
    node.container("liar", _limits(), _region(11, NOW + HOUR))
    node.publisher().publish()
    board = node.board()
    assert board.high_active_until_ns == 0
    assert board.entries == (shim_abi.BoardEntry(11, NOW),)  # "the future" is read as now


def test_a_high_priority_stamp_from_the_future_holds_no_longer_than_now(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.container("high", _limits(shim_abi.PRIORITY_HIGH), _region(11, 2**64 - 1))
    node.publisher().publish()
    assert node.board().high_active_until_ns == NOW + shim_abi.BOARD_HIGH_HOLD_NS


def test_a_container_cannot_pose_as_its_neighbour(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.container("victim", _limits(), _region(11, NOW - 1))
    node.container("impostor", _limits(), _region(11, NOW - 2))  # copies the victim's id
    node.publisher().publish()
    # Neither is identified: the victim counts both as someone else (never "alone").
    assert {e.id for e in node.board().entries} == {0}


@pytest.mark.parametrize(
    "plant",
    [
        "truncated",
        "empty",
        "garbage",
        "huge",
        "symlink",
        "fifo",
        "directory",
        "absurd_device_count",
    ],
)
def test_hostile_region_files_are_skipped_without_hanging(tmp_path: Path, plant: str) -> None:
    node = Node(tmp_path)
    good = node.container("good", _limits(shim_abi.PRIORITY_HIGH), _region(11, NOW - 1))
    bad = node.container("bad", _limits(), None)
    if plant == "truncated":
        bad.write_bytes(_region(22, NOW)[:100])
    elif plant == "empty":
        bad.write_bytes(b"")
    elif plant == "garbage":
        bad.write_bytes(os.urandom(shim_abi.REGION_SIZE))
    elif plant == "huge":
        with bad.open("wb") as out:
            out.truncate(1 << 40)
    elif plant == "symlink":
        bad.symlink_to(good)  # would read the neighbour's region as its own
    elif plant == "fifo":
        os.mkfifo(bad)
    elif plant == "directory":
        bad.mkdir()
    else:
        data = bytearray(_region(22, NOW))
        struct.pack_into("<I", data, shim_abi.HDR_OFF_DEVICE_COUNT, 2**32 - 1)
        bad.write_bytes(bytes(data))
    _within(5, node.publisher().publish)
    assert node.board().entries == (shim_abi.BoardEntry(11, NOW - 1),)


def _pod_limits() -> bytes:
    return shim_abi.encode_limits(
        shim_abi.Limits(
            devices=(shim_abi.DeviceLimits(GPU, 1 << 30, 50),),
            namespace="ns",
            pod="pod",
            container="main",
            pod_uid="uid-pod",
        )
    )


class _OneContainer:
    def __init__(self, *resources: str) -> None:
        self.resources = resources

    def list(self) -> list[ContainerDevices]:
        held = {r: frozenset({"d1"}) for r in self.resources}
        return [ContainerDevices("ns", "pod", "main", held)]


def test_the_metrics_scrape_never_blocks_on_a_planted_fifo(tmp_path: Path) -> None:
    """live_containers (the metrics scrape) reads each container's region: a FIFO planted
    where the region belongs (the container writes its region volume) must not hang it."""
    files = AllocationFiles(tmp_path / "state", tmp_path / "pods")
    resource = "tencent.com/vcuda-core"
    key = allocation_key(resource, ["d1"])
    files.prepare(key)
    files.write_limits(key, _pod_limits().decode())
    os.mkfifo(region_in_volume(tmp_path / "pods", "uid-pod", "main"))

    found: list[LiveContainer] = []
    _within(5, lambda: found.extend(live_containers(_OneContainer(resource), [resource], files)))
    assert len(found) == 1
    assert found[0].region is None and found[0].limits is not None


def test_a_region_is_read_from_its_pods_region_volume_or_an_older_agents_run_dir(
    tmp_path: Path,
) -> None:
    """A container's region is in its pod's region volume, which its limits name (pod UID,
    container); one an older agent started keeps it in the run dir it was given. The boards
    and the metrics find it in either place."""
    files = AllocationFiles(tmp_path / "state", tmp_path / "pods")
    resources = ("tencent.com/vcuda-core", "tencent.com/vcuda-memory")
    keys = [allocation_key(r, ["d1"]) for r in resources]
    for key in keys:
        files.prepare(key)
        files.write_limits(key, _pod_limits().decode())
    in_volume = region_in_volume(tmp_path / "pods", "uid-pod", "main")
    in_volume.write_bytes(_region(11, NOW - 1))
    node = tmp_path / "node"
    node.mkdir()
    boards = BoardFiles(node)
    publisher = BoardPublisher(boards, lambda: [GPU], allocation_sources(files), lambda: NOW)
    (found,) = live_containers(_OneContainer(*resources), resources, files)
    assert found.region is not None and len(found.region) == 1
    # One container, on the board once although both its allocations lead to its region.
    assert publisher.publish()[GPU].entries == (shim_abi.BoardEntry(11, NOW - 1),)
    # A container an older agent started: its region is in the allocation's run dir.
    in_volume.unlink()
    files.run_dir(keys[0]).mkdir()
    files.region_path(keys[0]).write_bytes(_region(22, NOW - 2))
    (found,) = live_containers(_OneContainer(*resources), resources, files)
    assert found.region is not None
    entries = BoardPublisher(
        boards, lambda: [GPU], allocation_sources(files), lambda: NOW
    ).publish()
    assert shim_abi.BoardEntry(22, NOW - 2) in entries[GPU].entries
    # Limits that name no pod (an older agent's) have no region volume to look in.
    assert files.region_for(keys[1], shim_abi.Limits(devices=())) is None
