"""Replace a file so readers see either the old or the new content, never a mix."""

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Write a temporary file next to ``path``, fsync it, set ``mode``, rename it over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        if path.is_dir() and not path.is_symlink():
            # A runtime creates a directory for a missing bind-mount source; replace it.
            path.rmdir()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
