"""Per-allocation host files: fresh per allocation, atomic limits, never yanked from a holder."""

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from agent.hostfiles import (
    AllocationFiles,
    UntrustedFileError,
    UntrustedRead,
    allocation_key,
    read_untrusted,
)


def test_key_depends_on_resource_and_id_set_only() -> None:
    a = allocation_key("tencent.com/vcuda-core", ["x-core-2", "x-core-1"])
    assert a == allocation_key("tencent.com/vcuda-core", ["x-core-1", "x-core-2"])
    assert a != allocation_key("tencent.com/vcuda-memory", ["x-core-1", "x-core-2"])
    assert a != allocation_key("tencent.com/vcuda-core", ["x-core-1"])
    assert a.startswith("vcuda-core-")


def test_limits_are_read_only_and_replaced_whole(tmp_path: Path) -> None:
    files = AllocationFiles(tmp_path)
    files.prepare("k")
    files.write_limits("k", "version=1\nfirst\n")
    before = os.stat(files.limits_path("k")).st_ino
    files.write_limits("k", "version=1\nsecond\n")
    assert files.read_limits("k") == "version=1\nsecond\n"
    assert os.stat(files.limits_path("k")).st_ino != before  # renamed over, not rewritten
    assert stat.S_IMODE(os.stat(files.limits_path("k")).st_mode) == 0o444
    assert sorted(p.name for p in files.directory("k").iterdir()) == ["limits"]


def test_a_directory_left_at_the_limits_path_is_replaced(tmp_path: Path) -> None:
    files = AllocationFiles(tmp_path)
    files.prepare("k")
    files.limits_path("k").mkdir()  # what a runtime does for a missing bind-mount source
    files.write_limits("k", "version=1\n")
    assert files.limits_path("k").is_file()


def test_reallocation_leaves_the_previous_holders_files_alone(tmp_path: Path) -> None:
    """A holder an older agent started has its region in the allocation's run dir (mounted
    into it): a new holder of the IDs leaves it in place, set aside."""
    files = AllocationFiles(tmp_path)
    files.prepare("k")
    files.write_limits("k", "version=1\n")
    files.run_dir("k").mkdir()
    region = files.region_path("k")
    region.write_bytes(b"old holder's region")
    with region.open("rb") as still_open:
        files.prepare("k")
        assert files.read_limits("k") is None
        assert not files.run_dir("k").exists()  # a new holder's region is in its pod
        assert still_open.read() == b"old holder's region"
    (aside,) = files.directory("k").glob("run.old-*")
    assert (aside / "region").read_bytes() == b"old holder's region"
    files.prepare("k")  # the one before the previous is removed
    assert not aside.exists()


# ---- container-writable files are read as hostile input ----


def _read_in_thread(path: Path, max_bytes: int) -> object:
    """read_untrusted in a thread: a read that blocks fails the test instead of hanging it."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(read_untrusted(path, max_bytes))
        except UntrustedFileError as error:
            result.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert not worker.is_alive(), f"reading {path} blocked"
    return result[0]


def test_a_plain_file_is_read_whole_or_by_its_head(tmp_path: Path) -> None:
    path = tmp_path / "region"
    path.write_bytes(b"0123456789")
    read = read_untrusted(path, 10)
    assert read is not None and read.data == b"0123456789" and read.size == 10
    head = read_untrusted(path, 10, head=4)
    assert head is not None and head.data == b"0123"
    assert read_untrusted(tmp_path / "missing", 10) is None


@pytest.mark.parametrize("target", ["/dev/zero", "/etc/hostname", "elsewhere"])
def test_a_symbolic_link_is_never_followed(tmp_path: Path, target: str) -> None:
    (tmp_path / "elsewhere").write_bytes(b"secret")
    link = tmp_path / "region"
    link.symlink_to(target if target.startswith("/") else tmp_path / target)
    outcome = _read_in_thread(link, 1 << 20)
    assert isinstance(outcome, UntrustedFileError)
    assert "symbolic link" in str(outcome)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "region"
    os.mkfifo(fifo)
    outcome = _read_in_thread(fifo, 1 << 20)
    assert isinstance(outcome, UntrustedFileError) and "FIFO" in str(outcome)


def test_a_fifo_swapped_in_after_the_check_is_never_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: the container renames a FIFO (or a device node) over its region between
    the agent's check of the file and its open for reading, thousands of times a second;
    now and then the open landed on the FIFO (its writer saw a reader) or ran a device's
    driver. Made certain here: the swap happens right before each open that reads."""
    region = tmp_path / "region"
    region.write_bytes(b"0123456789")
    real_open = os.open
    opened_kinds: list[int] = []

    def swap_then_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if not flags & os.O_PATH and not opened_kinds:
            region.rename(tmp_path / "region-was")
            os.mkfifo(region)
        fd = real_open(path, flags, *args, **kwargs)
        opened_kinds.append(stat.S_IFMT(os.fstat(fd).st_mode))
        return fd

    monkeypatch.setattr(os, "open", swap_then_open)
    try:
        outcome: object = read_untrusted(region, 10)
    except UntrustedFileError as error:
        outcome = error
    monkeypatch.undo()
    assert stat.S_IFIFO not in opened_kinds
    # The file checked is the file read, whatever name it has by then.
    assert isinstance(outcome, UntrustedRead) and outcome.data == b"0123456789"


def test_a_device_node_is_refused(tmp_path: Path) -> None:
    node = tmp_path / "region"
    try:
        os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    outcome = _read_in_thread(node, 1 << 20)
    assert isinstance(outcome, UntrustedFileError) and "character device" in str(outcome)


def test_a_huge_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    huge = tmp_path / "region"
    with huge.open("wb") as out:
        out.truncate(1 << 40)  # 1 TiB, sparse: reading it whole would exhaust memory
    outcome = _read_in_thread(huge, 1 << 17)
    assert isinstance(outcome, UntrustedFileError)
    assert "at most 131072" in str(outcome)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "region").mkdir()
    outcome = _read_in_thread(tmp_path / "region", 10)
    assert isinstance(outcome, UntrustedFileError) and "directory" in str(outcome)
