"""A cgroup of the tier's own under which kubelet puts every pod (its `cgroupRoot`), so the
tier never touches a `kubepods` hierarchy a real kubelet on the same machine would own, and
teardown removes exactly what the tier created (cgroup v1, as on these machines; on cgroup
v2 the same name is created in the unified hierarchy)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")


def _hierarchies() -> list[Path]:
    if (CGROUP_FS / "cgroup.controllers").exists():  # cgroup v2 only
        return [CGROUP_FS]
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink())


class TierCgroup:
    def __init__(self, name: str) -> None:
        self.name = name  # kubelet's cgroupRoot is "/<name>"
        self.paths = [h / name for h in _hierarchies()]

    def create(self) -> TierCgroup:
        for path in self.paths:
            path.mkdir(exist_ok=True)
            if path.parent.name == "cpuset":
                # A new v1 cpuset starts empty: no task could join it or its children.
                for key in ("cpuset.cpus", "cpuset.mems"):
                    (path / key).write_text((path.parent / key).read_text())
        return self

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.paths:
            for procs in path.rglob("cgroup.procs") if path.is_dir() else ():
                with contextlib.suppress(OSError, ValueError):
                    found.update(int(line) for line in procs.read_text().split())
        return found

    def remove(self, timeout: float = 10.0) -> None:
        """SIGKILL whatever is still inside (containers left behind), then remove the tree."""
        deadline = time.monotonic() + timeout
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for path in self.paths:
            if not path.is_dir():
                continue
            for directory in sorted(
                (p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                path.rmdir()
