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
import logging
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from agent.inodeopen import by_descriptor, reopen, resolve

log = logging.getLogger(__name__)

# Directories a container wrote are opened this way only: never through a symlink.
_DIRECTORY_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Descriptors held open at once, one per level below the top.
MAX_OPEN_LEVELS: Final = 64
# Entries (files, links, directories) removed or moved before the walk gives up.
MAX_ENTRIES: Final = 200_000


@dataclass
class _Level:
    """One open directory of the walk: its name in its parent, its descriptor, and the
    subdirectories still to empty (listed once, when it was opened)."""

    name: str
    fd: int
    pending: list[str]


@dataclass
class _Walk:
    """One removal: the tree's top (an open descriptor), and what it has done so far."""

    top: int
    me: int = field(default_factory=os.geteuid)
    entries: int = 0

    def count(self) -> bool:
        """One more entry; whether the walk may go on."""
        self.entries += 1
        return self.entries <= MAX_ENTRIES

    def subdirectories(self, directory: int) -> list[str]:
        """Unlink every entry of ``directory`` but its subdirectories; their names."""
        found = []
        try:
            # Read as it goes: a directory of millions of entries is never held in memory.
            with os.scandir(directory) as listing:
                for entry in listing:
                    if not self.count():
                        break
                    name = entry.name
                    try:
                        found_mode = os.stat(name, dir_fd=directory, follow_symlinks=False)
                        if stat.S_ISDIR(found_mode.st_mode):
                            found.append(name)
                            continue
                        os.unlink(name, dir_fd=directory)
                    except OSError:
                        pass  # logged with the tree if it is left
        except OSError:
            pass
        return found

    def open_child(self, directory: int, name: str) -> int | None:
        """The subdirectory ``name``, its owner's permissions given back first, or None."""
        try:
            found = os.stat(name, dir_fd=directory, follow_symlinks=False)
            mode = 0o700 if found.st_uid == self.me else 0o777
            # A symlink swapped in since it was listed is refused here, never followed.
            os.chmod(name, mode, dir_fd=directory, follow_symlinks=False)
            return os.open(name, _DIRECTORY_FLAGS, dir_fd=directory)
        except (OSError, NotImplementedError):
            return None

    def empty(self) -> None:
        """Remove everything below the top, depth first, by descriptor; each directory is
        listed once."""
        top = _Level("", self.top, self.subdirectories(self.top))
        levels = [top]
        try:
            while levels and self.entries <= MAX_ENTRIES:
                level = levels[-1]
                if not level.pending:
                    levels.pop()
                    if levels:  # the top itself is the caller's
                        os.close(level.fd)
                        with contextlib.suppress(OSError):  # logged with the tree if left
                            os.rmdir(level.name, dir_fd=levels[-1].fd)
                    continue
                name = level.pending.pop()
                if not self.count():
                    break
                if len(levels) > MAX_OPEN_LEVELS:
                    moved = self._move_to_top(level.fd, name)
                    if moved is not None:
                        top.pending.append(moved)
                    continue
                child = self.open_child(level.fd, name)
                if child is not None:
                    levels.append(_Level(name, child, self.subdirectories(child)))
        finally:
            for level in levels[1:]:
                os.close(level.fd)

    def _move_to_top(self, parent: int, name: str) -> str | None:
        """Move a directory too deep to open up to the top, under a name of the agent's (that
        the container cannot take first); its new name, or None."""
        moved = f".removing-{secrets.token_hex(8)}"
        try:
            os.rename(name, moved, src_dir_fd=parent, dst_dir_fd=self.top)
        except OSError:
            return None
        return moved


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
        handle = resolve(root, directory=True)
    except OSError:
        return None
    try:
        # The resolved inode itself, never the name again; its owner's permissions back, or
        # everyone's when another user (an older container) made it.
        mode = 0o700 if os.fstat(handle).st_uid == os.geteuid() else 0o777
        os.chmod(by_descriptor(handle), mode)
        return reopen(handle, _DIRECTORY_FLAGS)
    except OSError:
        return None
    finally:
        os.close(handle)
