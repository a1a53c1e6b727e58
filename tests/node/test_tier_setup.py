"""The tier's own set-up: what a newcomer is told when something it needs is missing, and
the kernel settings kubelet changes being put back. No tier is started here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.node.tier.binaries import NodeTierUnavailableError, locate_node_binaries
from tests.node.tier.sysctls import SysctlGuard


def test_missing_node_binaries_name_the_script_that_builds_them(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "FRACGPU_CACHE": str(tmp_path),  # an empty cache: nothing built
    }
    with pytest.raises(NodeTierUnavailableError) as raised:
        locate_node_binaries(env)
    message = str(raised.value)
    for name in ("kubelet", "kube-scheduler", "kube-controller-manager"):
        assert f"{name} not found at {tmp_path / name}-1.20.2" in message, message
    assert "scripts/build-kube-node.sh" in message
    assert "FRACGPU_KUBELET" in message


@pytest.mark.skipif(os.geteuid() != 0, reason="writing kernel sysctls needs root")
def test_sysctl_guard_puts_back_what_kubelet_changes() -> None:
    path = Path("/proc/sys/kernel/panic")
    guard = SysctlGuard(("kernel.panic",))
    before = guard.saved["kernel.panic"]
    changed = "10" if before != "10" else "11"  # what kubelet 1.20 writes is 10
    path.write_text(changed + "\n")
    try:
        assert guard.changed() == {"kernel.panic": (before, changed)}
        guard.restore()
        assert path.read_text().strip() == before
        assert guard.changed() == {}
    finally:
        path.write_text(before + "\n")
