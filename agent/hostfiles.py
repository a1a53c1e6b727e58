"""The per-container files on the host that the device plugin mounts into containers.

Each allocation (one resource's device IDs for one container) gets a directory under the
state dir, named from a hash of the resource and its sorted device IDs:

    <state>/<key>/limits   the limits file, mode 0444, mounted read-only at /etc/fracgpu/limits
    <state>/<key>/run/     mounted read-write at /var/run/fracgpu; the shim keeps its
                           accounting region here

Kubelet hands a device ID to one container at a time, so a key names one live container;
when kubelet reuses the IDs for a new container, ``prepare`` starts it afresh without
touching files a previous holder may still have open or mounted.
"""

import hashlib
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from agent.atomic import write_atomically

LIMITS_FILE = "limits"
RUN_DIR = "run"
REGION_FILE = "region"


def prepare_node_dir(path: Path) -> None:
    """The directory of the node's priority boards: the shims of all containers create and
    share one board per GPU there, whatever user they run as (sticky, like /tmp)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o1777)


def allocation_key(resource: str, device_ids: Iterable[str]) -> str:
    digest = hashlib.sha256()
    digest.update(resource.encode())
    for device_id in sorted(set(device_ids)):
        digest.update(b"\0" + device_id.encode())
    slug = resource.rsplit("/", 1)[-1].replace(".", "-")
    return f"{slug}-{digest.hexdigest()[:24]}"


class AllocationFiles:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def directory(self, key: str) -> Path:
        return self.state_dir / key

    def limits_path(self, key: str) -> Path:
        return self.directory(key) / LIMITS_FILE

    def run_dir(self, key: str) -> Path:
        return self.directory(key) / RUN_DIR

    def region_path(self, key: str) -> Path:
        return self.run_dir(key) / REGION_FILE

    def prepare(self, key: str) -> None:
        """A fresh directory for a new allocation: no limits yet, an empty run dir.

        A previous run dir is renamed aside, not emptied: if anything still has it mounted,
        it keeps its region; the one before that is removed.
        """
        self.limits_path(key).unlink(missing_ok=True)
        run = self.run_dir(key)
        for old in self.directory(key).glob(f"{RUN_DIR}.old-*"):
            shutil.rmtree(old, ignore_errors=True)
        if run.exists():
            run.rename(run.with_name(f"{RUN_DIR}.old-{time.time_ns()}"))
        run.mkdir(parents=True)
        # Containers may run as any user; every process of the container shares the region.
        os.chmod(run, 0o777)

    def write_limits(self, key: str, content: str) -> None:
        self.run_dir(key).mkdir(parents=True, exist_ok=True)
        write_atomically(self.limits_path(key), content.encode(), 0o444)

    def read_limits(self, key: str) -> str | None:
        try:
            return self.limits_path(key).read_text()
        except FileNotFoundError:
            return None

    def all_keys(self) -> list[str]:
        if not self.state_dir.is_dir():
            return []
        return sorted(p.name for p in self.state_dir.iterdir() if p.is_dir())

    def age_seconds(self, key: str, now: float) -> float:
        return now - self.directory(key).stat().st_mtime

    def remove(self, key: str) -> None:
        shutil.rmtree(self.directory(key), ignore_errors=True)
