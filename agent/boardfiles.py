"""The node directory's files: one priority board per GPU, named by its UUID, that only the
agent writes (``agent.boards`` fills them).

A container is given the boards of its own GPUs only, each file mounted read-only at
``/var/run/fracgpu-node/<uuid>``: a tenant cannot read when the containers on the node's other
GPUs launch work. A file mount holds the inode it was made from, so a board is created once
(before the first container of its GPU starts) and kept across the agent's restarts; it is
rewritten in place, never replaced.
"""

import os
import re
import stat
from pathlib import Path
from typing import Final

from fracgpu.shim_abi import BOARD_SIZE

# Boards are written in place by their owner, the agent, and read by everyone else.
BOARD_MODE: Final = 0o644
# GPU UUIDs as NVML gives them (GPU-<hex groups>, MIG-...), and the test doubles' names.
_BOARD_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_:-]{0,127}")


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


def ensure_board(node_dir: Path, uuid: str) -> Path:
    """The GPU's board, created empty if missing (an empty board reads as none until the
    agent publishes), so that it can be mounted into a container before any publish."""
    path = board_path(node_dir, uuid)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, BOARD_MODE)
    os.close(fd)
    return path


def is_own_board(node_dir: Path, name: str) -> bool:
    """Whether ``name`` in ``node_dir`` is a board as the agent makes them: a regular file of
    one link, the agent's, of the board's mode and at most its size. Anything else there was
    left by an older version whose containers could write the directory, or planted."""
    if not _BOARD_NAME.fullmatch(name):
        return False
    try:
        found = os.lstat(node_dir / name)
    except OSError:
        return False
    return (
        stat.S_ISREG(found.st_mode)
        and found.st_nlink == 1
        and found.st_uid == os.geteuid()
        and stat.S_IMODE(found.st_mode) == BOARD_MODE
        and found.st_size <= BOARD_SIZE
    )
