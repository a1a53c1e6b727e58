"""The node directory's files: one priority board per GPU, named by its UUID, that only the
agent writes (``agent.boards`` fills them).

- A container is given the boards of its own GPUs only, each file mounted read-only at
  ``/var/run/fracgpu-node/<uuid>``: a tenant cannot read when the containers on the node's
  other GPUs launch work.
- A file mount holds the inode it was made from, so a board is made once (before the first
  container of its GPU starts), rewritten in place and kept across the agent's restarts.
  Which inodes are the agent's is recorded where no container can write (``record``): a
  file of the right name planted in the node directory by an older version's container
  (whose mount of it was writable) is removed, never taken for a board. (The record is of
  device and inode numbers: such a container could only match one by unlinking a board
  while no agent holds it, then getting its number again.)
- The agent holds every board open for writing for its life. The kernel then grants no
  lease on it: a container sharing the agent's uid could otherwise take a read lease on its
  own board and hold each of the agent's opens for the lease-break time (45 s), leaving
  every board on the node stale and Allocate waiting.
"""

import contextlib
import json
import os
import re
import stat
import threading
from pathlib import Path
from typing import Final

from agent.atomic import write_atomically
from agent.containertree import remove_container_tree
from agent.inodeopen import reopen, resolve
from fracgpu.shim_abi import BOARD_SIZE

# Boards are written in place by their owner, the agent, and read by everyone else.
BOARD_MODE: Final = 0o644
# The record's name in the agent's state directory (``--host-state-dir``).
BOARD_RECORD: Final = "boards.json"
# GPU UUIDs as NVML gives them (GPU-<hex groups>, MIG-...), and the test doubles' names.
_BOARD_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_:-]{0,127}")
# Never blocking: a FIFO, a lease or a device found where a board should be is an error.
_WRITE_FLAGS: Final = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
# The record of the agent's boards is small (a line per GPU); a larger one is not the agent's.
_RECORD_MAX_BYTES: Final = 64 * 1024

Identity = tuple[int, int]  # (device, inode)


class BoardNameError(ValueError):
    """A GPU UUID that cannot name a board file."""


def board_path(node_dir: Path, uuid: str) -> Path:
    """The board of the GPU ``uuid`` in ``node_dir``."""
    if not _BOARD_NAME.fullmatch(uuid):
        raise BoardNameError(
            f"GPU UUID {uuid[:140]!r} cannot name a board: letters, digits, '_', ':' and '-', "
            "at most 128, starting with a letter or digit"
        )
    return node_dir / uuid


class BoardFiles:
    """The node's boards, held open for writing; safe to use from several threads."""

    def __init__(self, node_dir: Path, record: Path | None = None) -> None:
        self.node_dir = node_dir
        # Where the agent's boards' inodes are kept across its restarts (None: not kept).
        self._record = record
        self._held: dict[str, tuple[int, Identity]] = {}
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """At start: the directory the agent's alone (mode 0755), the boards it recorded kept
        and held, everything else there removed."""
        self.node_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.node_dir, 0o755)
        recorded = self._read_record()
        with self._lock:
            for entry in self.node_dir.iterdir():
                known = recorded.get(entry.name)
                if known is not None and self._hold_recorded(entry.name, known):
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    remove_container_tree(entry)
                else:
                    entry.unlink(missing_ok=True)
            self._save_record()

    def ensure(self, uuid: str) -> Path:
        """The GPU's board, made empty if it is missing or is not the agent's (an empty
        board reads as none until the agent publishes), so that it can be mounted into a
        container before any publish."""
        with self._lock:
            self._fd(uuid)
            return board_path(self.node_dir, uuid)

    def write(self, uuid: str, data: bytes) -> None:
        """Rewrite the GPU's board in place, whole, with one write."""
        with self._lock:
            os.pwrite(self._fd(uuid), data, 0)

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._held.values():
                os.close(fd)
            self._held.clear()

    # -- under the lock ---------------------------------------------------------------------
    def _fd(self, uuid: str) -> int:
        path = board_path(self.node_dir, uuid)
        held = self._held.get(uuid)
        if held is not None:
            if _identity(path) == held[1]:
                return held[0]
            os.close(held[0])  # replaced under the agent (by an older container): remake it
            del self._held[uuid]
        if path.is_dir() and not path.is_symlink():
            # A runtime makes a directory for a missing bind-mount source.
            remove_container_tree(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, _WRITE_FLAGS | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, BOARD_MODE)
        os.fchmod(fd, BOARD_MODE)  # whatever the umask
        found = os.fstat(fd)
        self._held[uuid] = (fd, (found.st_dev, found.st_ino))
        self._save_record()
        return fd

    def _hold_recorded(self, name: str, known: Identity) -> bool:
        """Hold ``name`` if it is still the board the agent recorded: that inode, a regular
        file of one link, of at most a board's size. Checked on a descriptor that opens
        nothing (O_PATH), then that inode opened for writing: never a FIFO or device node
        swapped in between."""
        path = self.node_dir / name
        try:
            handle = resolve(path)
        except OSError:
            return False
        try:
            found = os.fstat(handle)
            if not (
                stat.S_ISREG(found.st_mode)
                and (found.st_dev, found.st_ino) == known
                and found.st_nlink == 1
                and found.st_size <= BOARD_SIZE
            ):
                return False
            fd = reopen(handle, _WRITE_FLAGS)
        except OSError:
            return False
        finally:
            os.close(handle)
        os.fchmod(fd, BOARD_MODE)
        self._held[name] = (fd, known)
        return True

    def _read_record(self) -> dict[str, Identity]:
        if self._record is None:
            return {}
        try:
            with open(self._record, "rb") as f:
                raw = json.loads(f.read(_RECORD_MAX_BYTES + 1)[:_RECORD_MAX_BYTES])
        except (OSError, ValueError):
            return {}  # none yet, or unreadable: no board is kept
        if not isinstance(raw, dict):
            return {}
        return {
            name: (dev, ino)
            for name, value in raw.items()
            if isinstance(name, str)
            and isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, int) for v in value)
            for dev, ino in [value]
        }

    def _save_record(self) -> None:
        if self._record is None:
            return
        held = {uuid: list(identity) for uuid, (_, identity) in sorted(self._held.items())}
        write_atomically(self._record, json.dumps(held).encode(), 0o600)


def _identity(path: Path) -> Identity | None:
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino) if stat.S_ISREG(found.st_mode) else None
