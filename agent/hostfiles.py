"""The per-container files on the host that the device plugin mounts into containers.

Each allocation (one resource's device IDs for one container) gets a directory under the
state dir, named from a hash of the resource and its sorted device IDs:

    <state>/<key>/limits   the limits file, mode 0444, mounted read-only at /etc/fracgpu/limits
    <state>/<key>/served   queue mode: which queued pod's container Allocate served these
                           IDs to (agent-only, never mounted)
    <state>/<key>/run/     containers an older agent started only: their accounting region,
                           in a directory mounted read-write at /var/run/fracgpu

A container's accounting region is in its pod's own memory: the region volume the mutating
webhook gives every GPU container (``fracgpu.names.region_volume_name``), a memory-backed
emptyDir that kubelet keeps at <kubelet pods dir>/<pod UID>/volumes/kubernetes.io~empty-dir/
<volume>. What the container writes there is its pod's memory, never host disk
(``region_for``).

Kubelet hands a device ID to one container at a time, so a key names one live container;
when kubelet reuses the IDs for a new container, ``prepare`` starts it afresh without
touching files a previous holder may still have open or mounted.
"""

import hashlib
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.atomic import write_atomically
from fracgpu import names
from fracgpu.shim_abi import LIMITS_MAX_BYTES, Limits

log = logging.getLogger(__name__)

LIMITS_FILE = "limits"
SERVED_FILE = "served"
RUN_DIR = "run"
REGION_FILE = "region"


class UntrustedFileError(Exception):
    """A container-writable path that is not a plain file of a sane size; says what it is."""


@dataclass(frozen=True)
class UntrustedRead:
    data: bytes
    mtime: float
    size: int


SERVED_MAX_BYTES = 4096

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def open_untrusted(path: Path, max_bytes: int) -> tuple[int, os.stat_result] | None:
    """Open a file a container can write for reading, or None if it does not exist.

    Only a regular file is opened: never through a symbolic link (O_NOFOLLOW), never a
    FIFO, socket or device node (checked before opening, again on the open file), never
    blocking (O_NONBLOCK), and never one larger than max_bytes. Anything else raises
    UntrustedFileError naming what was found. The caller closes the descriptor.
    """
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        # A container may chmod its own directory: the agent runs without the capability
        # that reads past permissions, and one unreadable file must not fail the others.
        raise UntrustedFileError(f"{path} cannot be examined: {error.strerror}") from None
    if not stat.S_ISREG(before.st_mode):
        raise UntrustedFileError(f"{path} is a {_kind(before.st_mode)}, a regular file is read")
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise UntrustedFileError(f"{path} cannot be opened safely: {error.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (
            before.st_dev,
            before.st_ino,
        ):
            raise UntrustedFileError(f"{path} changed while being opened")
        if st.st_size > max_bytes:
            raise UntrustedFileError(f"{path} has {st.st_size} bytes, at most {max_bytes} are read")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_untrusted(path: Path, max_bytes: int, head: int | None = None) -> UntrustedRead | None:
    """Read a file a container can write (see open_untrusted), or None if it does not
    exist. head: read only that many leading bytes."""
    opened = open_untrusted(path, max_bytes)
    if opened is None:
        return None
    fd, st = opened
    try:
        want = max_bytes if head is None else min(head, max_bytes)
        return UntrustedRead(os.pread(fd, want, 0), st.st_mtime, st.st_size)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


def prepare_node_dir(path: Path) -> None:
    """The directory of the node's priority boards: written by the agent only, mounted
    read-only into every container. Anything else found there (left by an older version
    whose containers could write it) is removed."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o755)
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            remove_container_tree(entry)
        else:
            entry.unlink(missing_ok=True)


def allocation_key(resource: str, device_ids: Iterable[str]) -> str:
    digest = hashlib.sha256()
    digest.update(resource.encode())
    for device_id in sorted(set(device_ids)):
        digest.update(b"\0" + device_id.encode())
    slug = resource.rsplit("/", 1)[-1].replace(".", "-")
    return f"{slug}-{digest.hexdigest()[:24]}"


# A pod UID as a path component: kubelet names the pod's directory by it (a UUID; tests
# use shorter names). The agent wrote it into the limits file, from the API's pod.
_POD_UID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


class AllocationFiles:
    def __init__(self, state_dir: Path, pods_dir: Path | None = None) -> None:
        self.state_dir = state_dir
        # kubelet's pods directory (<kubelet root>/pods): where the region volumes are
        self.pods_dir = pods_dir

    def directory(self, key: str) -> Path:
        return self.state_dir / key

    def limits_path(self, key: str) -> Path:
        return self.directory(key) / LIMITS_FILE

    def run_dir(self, key: str) -> Path:
        return self.directory(key) / RUN_DIR

    def region_path(self, key: str) -> Path:
        """The region of a container an older agent started (in the run dir it mounted)."""
        return self.run_dir(key) / REGION_FILE

    def region_for(self, key: str, limits: Limits) -> Path | None:
        """Where the region of the container holding allocation ``key`` is: in its region
        volume, or (started by an older agent) in the allocation's run dir; None when its
        limits name no pod (written by an agent that did not record it)."""
        old = self.region_path(key)
        if os.path.lexists(old):
            return old
        uid, container = limits.pod_uid, limits.container
        if self.pods_dir is None or not uid or not container or not _POD_UID.fullmatch(uid):
            return None
        volume = names.region_volume_name(container)
        return self.pods_dir / uid / names.KUBELET_EMPTY_DIR_VOLUMES / volume / REGION_FILE

    def prepare(self, key: str) -> None:
        """A fresh directory for a new allocation: no limits yet.

        A previous holder's run dir (an older agent mounted one into each container) is
        renamed aside, not emptied: if anything still has it mounted, it keeps its region;
        the one before that is removed.
        """
        self.limits_path(key).unlink(missing_ok=True)
        self.served_path(key).unlink(missing_ok=True)
        run = self.run_dir(key)
        for old in self.directory(key).glob(f"{RUN_DIR}.old-*"):
            remove_container_tree(old)
        if run.exists():
            run.rename(run.with_name(f"{RUN_DIR}.old-{time.time_ns()}"))
        self.directory(key).mkdir(parents=True, exist_ok=True)

    def write_limits(self, key: str, content: str) -> None:
        self.directory(key).mkdir(parents=True, exist_ok=True)
        write_atomically(self.limits_path(key), content.encode(), 0o444)

    def served_path(self, key: str) -> Path:
        return self.directory(key) / SERVED_FILE

    def write_served(self, key: str, content: bytes) -> None:
        write_atomically(self.served_path(key), content, 0o400)

    def read_served(self, key: str) -> bytes | None:
        """The served record of this allocation, None without one (or if it is not sane)."""
        try:
            read = read_untrusted(self.served_path(key), SERVED_MAX_BYTES)
        except UntrustedFileError:
            return None
        return None if read is None else read.data

    def read_limits(self, key: str) -> str | None:
        """The limits file the agent wrote (None if missing or not a sane plain file)."""
        try:
            read = read_untrusted(self.limits_path(key), LIMITS_MAX_BYTES)
        except UntrustedFileError:
            return None
        return None if read is None else read.data.decode(errors="replace")

    def all_keys(self) -> list[str]:
        if not self.state_dir.is_dir():
            return []
        return sorted(p.name for p in self.state_dir.iterdir() if p.is_dir())

    def age_seconds(self, key: str, now: float) -> float:
        return now - self.directory(key).stat().st_mtime

    def remove(self, key: str) -> bool:
        """Remove an allocation's directory; whether it is gone (else it is logged)."""
        return remove_container_tree(self.directory(key))


# Directories a container wrote are opened this way only: never through a symlink.
_DIRECTORY_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Deeper than this a container's tree is left to rmtree (and its log line): each level
# holds one descriptor open.
_MAX_TREE_DEPTH: Final = 256


def _open_tree(directory: int, me: int, depth: int) -> None:
    """Give every directory below the open ``directory`` its owner's permissions back (or,
    not being its owner, everyone's: it is about to go), by descriptor; closes it."""
    try:
        with os.scandir(directory) as entries:
            names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        for name in names:
            try:
                found = os.stat(name, dir_fd=directory, follow_symlinks=False)
                if not stat.S_ISDIR(found.st_mode):
                    continue  # swapped since it was listed
                mode = 0o700 if found.st_uid == me else 0o777
                # A symlink swapped in since is refused here, never followed.
                os.chmod(name, mode, dir_fd=directory, follow_symlinks=False)
                child = os.open(name, _DIRECTORY_FLAGS, dir_fd=directory)
            except (OSError, NotImplementedError):
                continue
            if depth < _MAX_TREE_DEPTH:
                _open_tree(child, me, depth + 1)
            else:
                os.close(child)
    except OSError:
        pass  # rmtree reports what this leaves
    finally:
        os.close(directory)


def remove_container_tree(root: Path) -> bool:
    """Remove a directory tree a container could write into; whether it is gone.

    A container may have taken permissions away inside it (``chmod 000`` on a directory)
    and the agent runs without the capability that reads and writes past them: each
    directory is given its owner's permissions back first, which its owner may do (root in
    the container is the agent's uid), as may the agent with CAP_FOWNER (the chart grants
    it) whoever made it. What still cannot be removed is logged: it holds host disk.

    The container may still be writing (a previous run dir still mounted): the walk goes
    by directory descriptor, never through a path a container could swap for a symlink,
    so nothing outside ``root`` is touched. ``root``'s own path is the agent's."""
    me = os.geteuid()
    try:
        os.chmod(root, 0o700)
        top = os.open(root, _DIRECTORY_FLAGS)
    except OSError:
        top = None  # gone, or not a directory: rmtree below says what is left
    if top is not None:
        _open_tree(top, me, 0)
    shutil.rmtree(root, ignore_errors=True)
    if os.path.lexists(root):
        log.warning(
            "cannot remove files a container left on the host",
            extra={"path": str(root), "hint": "give the agent CAP_FOWNER, or remove them"},
        )
        return False
    return True
