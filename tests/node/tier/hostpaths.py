"""Machine-wide paths kubelet and containerd write outside the tier's work directory
(kubelet 1.20 hard-codes them): recorded before the tier starts, and at teardown whatever the
tier added is removed, so a run leaves the machine as it found it. A device-plugin directory
whose kubelet.sock answers belongs to a running kubelet: the tier refuses to start there."""

from __future__ import annotations

import contextlib
import shutil
import socket
from pathlib import Path

from .kubelet import DEVICE_PLUGIN_DIR

# Directories whose entries the tier's kubelet and containerd create.
WATCHED = (
    DEVICE_PLUGIN_DIR,
    Path("/var/lib/kubelet"),
    Path("/var/log/pods"),
    Path("/var/log/containers"),
    Path("/run/containerd"),  # the runc shims' sockets (containerd 1.6 puts them here)
)


def kubelet_running_here() -> bool:
    """Whether a kubelet (not the tier's) serves the machine's device-plugin socket."""
    sock_path = DEVICE_PLUGIN_DIR / "kubelet.sock"
    if not sock_path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        try:
            sock.connect(str(sock_path))
        except OSError:
            return False  # a stale socket from a kubelet that is gone
    return True


class HostPaths:
    def __init__(self) -> None:
        self._before: dict[Path, set[str] | None] = {
            path: set(p.name for p in path.iterdir()) if path.is_dir() else None for path in WATCHED
        }

    def restore(self) -> None:
        for path, before in self._before.items():
            if not path.is_dir():
                continue
            if before is None:
                shutil.rmtree(path, ignore_errors=True)
                continue
            for entry in path.iterdir():
                if entry.name in before:
                    continue
                with contextlib.suppress(OSError):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
