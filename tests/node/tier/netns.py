"""A network namespace for the node tier: the node's address, the pods' bridge and every
packet of kubelet, containerd and the pods stay inside it (or on its loopback).

Only kubelet and containerd (and what they start) enter it, through `nsenter --net`, which
switches the network namespace alone: they keep the host's mount namespace, so kubelet's
mounts and containerd's are the same ones (as on a real node). The control plane, webhook
and agent stay on the host's loopback; kubelet reaches the apiserver through a forwarder
(forward.py) that listens on the namespace's loopback.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
T = TypeVar("T")

# The node's own address (kubelet refuses a loopback node IP) on one end of a veth pair whose
# other end is also inside the namespace: nothing is routed anywhere else.
NODE_IP = "10.213.0.2"
NODE_PREFIX = 24
POD_SUBNET = "10.213.1.0/24"


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr}")


class NetworkNamespace:
    def __init__(self, name: str) -> None:
        self.name = name
        self.path = NETNS_DIR / name

    def create(self) -> NetworkNamespace:
        _run(["ip", "netns", "add", self.name])
        try:
            inside = self.argv_prefix()
            _run([*inside, "ip", "link", "set", "lo", "up"])
            _run(
                [*inside, "ip", "link", "add", "fgnode0", "type", "veth", "peer", "name", "fgnode1"]
            )
            _run([*inside, "ip", "addr", "add", f"{NODE_IP}/{NODE_PREFIX}", "dev", "fgnode0"])
            _run([*inside, "ip", "link", "set", "fgnode0", "up"])
            _run([*inside, "ip", "link", "set", "fgnode1", "up"])
            # kubelet wants a default route to pick its node address; it leads to the veth
            # peer inside the namespace, where packets end (forwarding is off in a new netns).
            _run([*inside, "ip", "route", "add", "default", "dev", "fgnode0"])
        except BaseException:
            self.delete()
            raise
        return self

    def argv_prefix(self) -> list[str]:
        """Prefix for a command that must run in the namespace (network only)."""
        return ["nsenter", f"--net={self.path}", "--"]

    def inode(self) -> int:
        return os.stat(self.path).st_ino

    def call_inside(self, make: Callable[[], T]) -> T:
        """Run `make` on a thread that joined the namespace: sockets it creates belong to
        the namespace for their whole life, whichever thread uses them later."""
        box: dict[str, object] = {}

        def target() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(self.path, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    box["error"] = OSError(err, f"setns({self.path}): {os.strerror(err)}")
                    return
                box["value"] = make()
            except BaseException as error:  # handed to the caller
                box["error"] = error
            finally:
                os.close(fd)

        # A fresh thread, ending right after: no other code ever runs in the namespace.
        thread = threading.Thread(target=target, name=f"netns-{self.name}")
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]

    def pids(self) -> list[int]:
        """Processes whose network namespace is this one (kubelet, containerd, shims)."""
        try:
            inode = self.inode()
        except FileNotFoundError:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.stat(entry / "ns" / "net").st_ino == inode:
                    found.append(int(entry.name))
        return found

    def kill_all(self, timeout: float = 10.0) -> list[int]:
        """SIGKILL whatever still runs in the namespace; returns the pids found."""
        found = self.pids()
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        return found

    def delete(self) -> None:
        if self.path.exists():
            self.kill_all()
            subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)
