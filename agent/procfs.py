"""Reading a process's files under a /proc that may be the host's (slice audit, context probe)."""

import os
from pathlib import Path


def read_proc_file(path: Path, cap: int) -> str | None:
    """At most ``cap`` bytes of a /proc file, decoded, or None when it cannot be read (the
    process is gone, or it is not ours to read). Symlinks are not followed, and the open does
    not block: the path names another process's file, which could be anything."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, cap).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
