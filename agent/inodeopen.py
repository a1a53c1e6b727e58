"""Open a path a container can change under the agent: resolve the name once, look at what
it names, then open that very inode, never the name again (a container renaming a FIFO,
device node or symbolic link over it in between gets nowhere)."""

import os
from pathlib import Path
from typing import Final

# Resolving opens nothing: no FIFO's reader, no device's driver, no lease to wait out.
_RESOLVE: Final = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def resolve(path: Path, *, directory: bool = False) -> int:
    """A descriptor of what ``path`` names, never through a symbolic link (a link is
    resolved as itself), that opens nothing; the caller closes it."""
    return os.open(path, _RESOLVE | (os.O_DIRECTORY if directory else 0))


def by_descriptor(handle: int) -> str:
    """A path to the resolved inode itself, for calls that take a path (chmod, open)."""
    return f"/proc/self/fd/{handle}"


def reopen(handle: int, flags: int) -> int:
    """The resolved inode opened with ``flags`` (close-on-exec; the /proc link is followed,
    so O_NOFOLLOW is dropped)."""
    return os.open(by_descriptor(handle), (flags | os.O_CLOEXEC) & ~os.O_NOFOLLOW)
