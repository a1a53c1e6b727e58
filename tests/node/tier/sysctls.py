"""kubelet sets kernel sysctls when it starts (protectKernelDefaults off): these are
machine-wide, not per network namespace, so the tier records them first and writes them back
after every kubelet start and at teardown."""

from __future__ import annotations

import contextlib
from pathlib import Path

# What kubelet 1.20's container manager sets (setupKernelTunables).
KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)


def _path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


class SysctlGuard:
    def __init__(self, names: tuple[str, ...] = KUBELET_SYSCTLS) -> None:
        self.saved: dict[str, str] = {}
        for name in names:
            with contextlib.suppress(OSError):
                self.saved[name] = _path(name).read_text().strip()

    def changed(self) -> dict[str, tuple[str, str]]:
        """name -> (recorded, now) for every sysctl that differs from the record."""
        out = {}
        for name, value in self.saved.items():
            with contextlib.suppress(OSError):
                now = _path(name).read_text().strip()
                if now != value:
                    out[name] = (value, now)
        return out

    def restore(self) -> None:
        for name, (value, _) in self.changed().items():
            with contextlib.suppress(OSError):
                _path(name).write_text(value + "\n")
