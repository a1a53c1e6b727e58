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
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.atomic import write_atomically
from agent.containertree import remove_container_tree
from agent.inodeopen import reopen, resolve
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

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY


def open_untrusted(path: Path, max_bytes: int) -> tuple[int, os.stat_result] | None:
    """Open a file a container can write for reading, or None if it does not exist.

    Only a regular file is opened: never through a symbolic link (O_NOFOLLOW), never a
    FIFO, socket or device node, never blocking (O_NONBLOCK), and never one larger than
    max_bytes. Anything else raises UntrustedFileError naming what was found. The caller
    closes the descriptor.

    The name is resolved once, with O_PATH, which opens nothing (no FIFO's reader, no
    device's driver, no lease); the inode found is checked, then opened for reading through
    that descriptor, never by the name again: a container swapping a FIFO or device node in
    between the check and the open (it renames in its own volume at will) gets nowhere.
    """
    try:
        handle = resolve(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        # A container may chmod its own directory: the agent runs without the capability
        # that reads past permissions, and one unreadable file must not fail the others.
        raise UntrustedFileError(f"{path} cannot be examined: {error.strerror}") from None
    try:
        found = os.fstat(handle)
        if not stat.S_ISREG(found.st_mode):
            raise UntrustedFileError(f"{path} is a {_kind(found.st_mode)}, a regular file is read")
        if found.st_size > max_bytes:
            raise UntrustedFileError(
                f"{path} has {found.st_size} bytes, at most {max_bytes} are read"
            )
        try:
            fd = reopen(handle, _READ_FLAGS)
        except OSError as error:
            raise UntrustedFileError(f"{path} cannot be opened safely: {error.strerror}") from None
    finally:
        os.close(handle)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (found.st_dev, found.st_ino):
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
