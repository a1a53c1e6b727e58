"""Finding what the node tier runs, with a fix-it message when something is absent.

Kubernetes binaries: built by scripts/build-kube-node.sh into ~/.cache/fracgpu (or
FRACGPU_KUBELET / FRACGPU_KUBE_SCHEDULER / FRACGPU_KUBE_CONTROLLER_MANAGER); the rest from
Debian packages (scripts/install-system-deps.sh). The tier needs root (network namespaces,
mounts, cgroups); without it, or without a binary, its tests skip, and fail in CI.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness.config import APISERVER_VERSION, E2EConfig, _default_cache_dir

CNI_PLUGINS = ("bridge", "host-local", "loopback")


class NodeTierUnavailableError(RuntimeError):
    """Something the node tier needs is missing."""


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    kube_scheduler: Path
    kube_controller_manager: Path
    containerd: Path
    ctr: Path
    runc: Path
    busybox: Path
    jq: Path


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def locate_node_binaries(env: Mapping[str, str] | None = None) -> NodeBinaries:
    env = os.environ if env is None else env
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("the node tier must run as root (network namespaces, mounts, cgroups)")
    cache = _default_cache_dir(env)
    kube: dict[str, Path] = {}
    for name in ("kubelet", "kube-scheduler", "kube-controller-manager"):
        variable = "FRACGPU_" + name.upper().replace("-", "_")
        path = Path(env.get(variable) or cache / f"{name}-{APISERVER_VERSION}")
        if not _executable(path):
            problems.append(
                f"{name} not found at {path}: run `scripts/build-kube-node.sh` "
                f"(builds and caches it) or set {variable}"
            )
        kube[name] = path
    debian = {
        "containerd": "containerd",
        "ctr": "containerd",
        "runc": "runc",
        "busybox": "busybox-static",
        "jq": "jq",
        "nsenter": "util-linux",
        "ip": "iproute2",
    }
    found: dict[str, Path] = {}
    for tool, package in debian.items():
        where = shutil.which(tool, path=env.get("PATH", os.defpath) + ":/usr/sbin:/sbin")
        if where is None:
            problems.append(
                f"{tool} not found: install Debian's {package} (scripts/install-system-deps.sh)"
            )
        else:
            found[tool] = Path(where)
    busybox = found.get("busybox")
    if busybox is not None and "statically linked" not in _file_kind(busybox):
        problems.append(f"{busybox} is not statically linked: install busybox-static")
    for plugin in CNI_PLUGINS:
        if not _executable(Path("/usr/lib/cni") / plugin):
            problems.append(
                f"CNI plugin /usr/lib/cni/{plugin} missing: install containernetworking-plugins"
            )
    if problems:
        raise NodeTierUnavailableError("; ".join(problems))
    return NodeBinaries(
        kubelet=kube["kubelet"],
        kube_scheduler=kube["kube-scheduler"],
        kube_controller_manager=kube["kube-controller-manager"],
        containerd=found["containerd"],
        ctr=found["ctr"],
        runc=found["runc"],
        busybox=found["busybox"],
        jq=found["jq"],
    )


def _file_kind(path: Path) -> str:
    # ELF without a PT_INTERP program header is static; read the header table directly.
    data = path.read_bytes()[:65536]
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return "not a 64-bit ELF"
    (phoff,) = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    for i in range(phnum):
        (p_type,) = struct.unpack_from("<I", data, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP
            return "dynamically linked"
    return "statically linked"


def require_node_binaries(config: E2EConfig) -> NodeBinaries:
    """The binaries, or end the test: fail in CI (the tier must run there), else skip."""
    try:
        return locate_node_binaries()
    except NodeTierUnavailableError as error:
        if config.in_ci:
            pytest.fail(f"node tier cannot run in CI: {error}", pytrace=False)
        pytest.skip(f"node tier cannot run: {error}")
