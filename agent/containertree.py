"""Remove a directory tree a container could write into, as hostile input.

- A container may take permissions away inside it (``chmod 000`` on a directory), and the
  agent runs without the capability that reads and writes past them: each directory is
  given its owner's permissions back before it is opened, which its owner may do (root in
  the container is the agent's uid), as may the agent with CAP_FOWNER (the chart grants it)
  whoever made it.
- The container may still be writing (a previous run dir still mounted): the walk goes by
  directory descriptor, never through a path it could swap for a symlink, so nothing
  outside the tree is touched.
- The tree may be of any depth: the walk keeps an explicit stack (no recursion, which a
  chain of a thousand directories would exhaust), at most ``MAX_OPEN_LEVELS`` descriptors
  deep; a directory deeper than that is moved up to the top of the tree and emptied from
  there.
- The container may keep adding entries while it is removed: the walk stops after
  ``MAX_ENTRIES``, and whatever is left is logged.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

# Directories a container wrote are opened this way only: never through a symlink.
_DIRECTORY_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Descriptors held open at once, one per level below the top.
MAX_OPEN_LEVELS: Final = 64
# Entries (files, links, directories) removed or moved before the walk gives up.
MAX_ENTRIES: Final = 1_000_000


@dataclass
class _Walk:
    """One removal: the tree's top (an open descriptor), and what it has done so far."""

    top: int
    me: int = field(default_factory=os.geteuid)
    entries: int = 0
    # Directories that could not be removed or opened (device, inode): never tried again.
    stuck: set[tuple[int, int]] = field(default_factory=set)
    moved: itertools.count[int] = field(default_factory=itertools.count)

    def count(self) -> bool:
        """One more entry; whether the walk may go on."""
        self.entries += 1
        return self.entries <= MAX_ENTRIES

    def next_directory(self, directory: int) -> tuple[str, int] | None:
        """Unlink every entry of ``directory`` but its subdirectories; the first of those that
        can be opened (its owner's permissions given back first), open, or None."""
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError:
            return None
        for entry in entries:
            if not self.count():
                return None
            try:
                found = os.stat(entry.name, dir_fd=directory, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(found.st_mode):
                with contextlib.suppress(OSError):  # logged with the tree if it is left
                    os.unlink(entry.name, dir_fd=directory)
                continue
            if (found.st_dev, found.st_ino) in self.stuck:
                continue
            try:
                mode = 0o700 if found.st_uid == self.me else 0o777
                # A symlink swapped in since is refused here, never followed.
                os.chmod(entry.name, mode, dir_fd=directory, follow_symlinks=False)
                child = os.open(entry.name, _DIRECTORY_FLAGS, dir_fd=directory)
            except (OSError, NotImplementedError):
                self.stuck.add((found.st_dev, found.st_ino))
                continue
            return entry.name, child
        return None

    def empty(self) -> None:
        """Remove everything below the top, depth first, by descriptor."""
        opened: list[tuple[str, int]] = []  # (name in its parent, descriptor), top down
        while True:
            current = opened[-1][1] if opened else self.top
            found = self.next_directory(current)
            if found is not None and len(opened) >= MAX_OPEN_LEVELS:
                name, child = found
                os.close(child)
                self._move_to_top(current, name)
                continue
            if found is not None:
                opened.append(found)
                continue
            if not opened or self.entries > MAX_ENTRIES:
                break
            name, done = opened.pop()
            parent = opened[-1][1] if opened else self.top
            try:
                finished = os.fstat(done)
                os.rmdir(name, dir_fd=parent)
            except OSError:
                self.stuck.add((finished.st_dev, finished.st_ino))
            finally:
                os.close(done)
        for _, descriptor in opened:
            os.close(descriptor)

    def _move_to_top(self, parent: int, name: str) -> None:
        """Move a directory too deep to open up to the top, under a name of the agent's."""
        try:
            os.rename(name, f".removing-{next(self.moved)}", src_dir_fd=parent, dst_dir_fd=self.top)
        except OSError:
            try:
                found = os.stat(name, dir_fd=parent, follow_symlinks=False)
                self.stuck.add((found.st_dev, found.st_ino))
            except OSError:
                pass


def remove_container_tree(root: Path) -> bool:
    """Remove the tree at ``root`` (a path of the agent's, what is below it a container's);
    whether it is gone. What cannot be removed is logged: it holds host disk."""
    top = _open_top(root)
    if top is not None:
        try:
            _Walk(top).empty()
        finally:
            os.close(top)
        with contextlib.suppress(OSError):
            os.rmdir(root)
    elif os.path.islink(root) or (os.path.lexists(root) and not os.path.isdir(root)):
        with contextlib.suppress(OSError):  # a symlink or a file swapped in: never followed
            os.unlink(root)
    if os.path.lexists(root):
        log.warning(
            "cannot remove files a container left on the host",
            extra={"path": str(root), "hint": "give the agent CAP_FOWNER, or remove them"},
        )
        return False
    return True


def _open_top(root: Path) -> int | None:
    """``root`` opened as a directory, its owner's permissions given back first, or None
    (gone, or not a directory: never through a symlink, even one swapped in since it was
    listed)."""
    try:
        handle = os.open(root, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        # The checked inode itself, by its descriptor, never by the name again.
        by_descriptor = f"/proc/self/fd/{handle}"
        os.chmod(by_descriptor, 0o700)
        return os.open(by_descriptor, _DIRECTORY_FLAGS & ~os.O_NOFOLLOW)
    except OSError:
        return None
    finally:
        os.close(handle)
