"""The node directory's boards: the agent's alone, kept across its restarts, held open."""

import fcntl
import os
import stat
import threading
from pathlib import Path

import pytest

from agent.boardfiles import BOARD_MODE, BoardFiles, BoardNameError
from fracgpu.shim_abi import BOARD_SIZE


def test_the_node_dir_is_the_agents_only(tmp_path: Path) -> None:
    node = tmp_path / "node"
    node.mkdir()
    os.chmod(node, 0o1777)  # as an older version left it, with what containers planted
    (node / "GPU-x").symlink_to("/etc/passwd")
    os.mkfifo(node / "fifo")
    (node / "planted").mkdir()
    boards = BoardFiles(node)
    boards.prepare()
    assert stat.S_IMODE(node.stat().st_mode) == 0o755
    assert list(node.iterdir()) == []


def test_the_agents_own_boards_outlive_its_restart_and_nothing_else_does(tmp_path: Path) -> None:
    """A running container's mount holds the board file it was made from: a board removed
    and made again at the agent's restart would leave that container reading a dead file.
    Only the inodes the agent recorded are kept: a file of a board's name, mode and owner
    that an older version's container planted (its mount of the directory was writable)
    is not the agent's."""
    node, record = tmp_path / "node", tmp_path / "state" / "boards.json"
    first = BoardFiles(node, record)
    first.prepare()
    kept = first.ensure("GPU-kept")
    before = kept.stat().st_ino
    replaced = first.ensure("GPU-replaced")
    linked = first.ensure("GPU-linked")
    grown = first.ensure("GPU-grown")
    first.close()
    os.link(linked, tmp_path / "held-elsewhere")
    with open(grown, "r+b") as f:
        f.write(b"x" * (BOARD_SIZE + 1))
    # Planted: the right name, mode and owner, another inode (the old one still held, so its
    # number is not given to the new file).
    held = os.open(replaced, os.O_RDONLY)
    replaced.unlink()
    replaced.write_bytes(b"")
    replaced.chmod(BOARD_MODE)
    planted = node / "GPU-planted"
    planted.write_bytes(b"")
    planted.chmod(BOARD_MODE)
    (node / "GPU-link").symlink_to(kept)
    (node / "GPU-dir").mkdir()
    again = BoardFiles(node, record)
    again.prepare()
    try:
        assert [p.name for p in node.iterdir()] == ["GPU-kept"]
        assert kept.stat().st_ino == before
        assert again.ensure("GPU-kept") == kept and kept.stat().st_ino == before
    finally:
        again.close()
        os.close(held)


def test_a_board_replaced_under_the_agent_is_made_again(tmp_path: Path) -> None:
    """A container of an older version (its mount of the directory writable) swaps its own
    file in for a board: the next container must not be given that file."""
    boards = BoardFiles(tmp_path / "node")
    boards.prepare()
    try:
        path = boards.ensure("GPU-a")
        path.unlink()
        path.symlink_to(tmp_path / "theirs")
        assert boards.ensure("GPU-a") == path
        assert not path.is_symlink() and path.is_file()
        boards.write("GPU-a", b"board")
        assert path.read_bytes() == b"board"
    finally:
        boards.close()


def test_boards_have_their_mode_whatever_the_umask(tmp_path: Path) -> None:
    """With umask 027 a board was made 0640: unreadable to containers, and not taken for
    the agent's own at its next start, so running containers read a dead one."""
    boards = BoardFiles(tmp_path / "node")
    boards.prepare()
    old = os.umask(0o027)
    try:
        path = boards.ensure("GPU-a")
    finally:
        os.umask(old)
        boards.close()
    assert stat.S_IMODE(path.stat().st_mode) == BOARD_MODE


def test_no_container_can_take_a_lease_on_a_board(tmp_path: Path) -> None:
    """The attack: a container running as the agent's uid opens its read-only board and
    takes a read lease. Every later open for writing then waited for the lease-break time
    (45 s): every board on the node went stale and Allocate stalled. The agent holds each
    board open for writing, and the kernel grants no read lease on a file open for
    writing."""
    boards = BoardFiles(tmp_path / "node")
    boards.prepare()
    try:
        path = boards.ensure("GPU-a")
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(OSError):
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        finally:
            os.close(fd)
        done = threading.Event()

        def write() -> None:
            boards.write("GPU-a", b"x" * BOARD_SIZE)
            done.set()

        threading.Thread(target=write, daemon=True).start()
        assert done.wait(5)
    finally:
        boards.close()


@pytest.mark.parametrize("uuid", ["../escape", "", "GPU/../x", ".hidden", "x" * 200])
def test_a_uuid_that_cannot_name_a_board_is_refused(tmp_path: Path, uuid: str) -> None:
    boards = BoardFiles(tmp_path / "node")
    boards.prepare()
    with pytest.raises(BoardNameError, match="cannot name a board"):
        boards.ensure(uuid)
    assert list((tmp_path / "node").iterdir()) == []
