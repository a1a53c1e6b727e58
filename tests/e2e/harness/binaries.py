"""Finding the etcd and kube-apiserver executables, with a fix-it message when absent."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from .config import E2EConfig


class MissingBinaryError(RuntimeError):
    """A control-plane executable is not installed or not built."""


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def locate_binaries(config: E2EConfig) -> Binaries:
    problems: list[str] = []
    etcd = config.etcd
    if etcd is None:
        found = shutil.which("etcd")
        etcd = Path(found) if found else Path("/usr/bin/etcd")
    if not _executable(etcd):
        problems.append(
            f"etcd not found at {etcd}: run `scripts/install-system-deps.sh` as root "
            "(Debian package etcd-server) or set FRACGPU_ETCD"
        )
    if not _executable(config.kube_apiserver):
        problems.append(
            f"kube-apiserver not found at {config.kube_apiserver}: run "
            "`scripts/build-kube-apiserver.sh` (builds and caches it) or set "
            "FRACGPU_KUBE_APISERVER"
        )
    if problems:
        raise MissingBinaryError("; ".join(problems))
    return Binaries(etcd=etcd, kube_apiserver=config.kube_apiserver)


def require_binaries(config: E2EConfig) -> Binaries:
    """The binaries, or end the test: fail in CI (the suite must run there), else skip."""
    try:
        return locate_binaries(config)
    except MissingBinaryError as error:
        if config.in_ci:
            pytest.fail(f"end-to-end binaries missing in CI: {error}", pytrace=False)
        pytest.skip(f"end-to-end binaries missing: {error}")
