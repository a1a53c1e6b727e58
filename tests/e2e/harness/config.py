"""Settings of the end-to-end harness, read from the environment in this one place."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

APISERVER_VERSION = "1.20.2"


def _default_cache_dir(env: Mapping[str, str]) -> Path:
    if env.get("FRACGPU_CACHE"):
        return Path(env["FRACGPU_CACHE"])
    return Path(env.get("HOME", str(Path.home()))) / ".cache" / "fracgpu"


def _default_scratch_dir(env: Mapping[str, str]) -> Path | None:
    # etcd fsyncs on every write; tmpfs keeps churn tests from being disk bound.
    if env.get("FRACGPU_E2E_TMPDIR"):
        return Path(env["FRACGPU_E2E_TMPDIR"])
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


@dataclass(frozen=True)
class E2EConfig:
    """Where the binaries are, where scratch data goes, and whether missing binaries fail."""

    in_ci: bool
    kube_apiserver: Path
    etcd: Path | None
    scratch_dir: Path | None
    keep_logs: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> E2EConfig:
        env = os.environ if env is None else env
        cache = _default_cache_dir(env)
        apiserver = env.get("FRACGPU_KUBE_APISERVER") or str(
            cache / f"kube-apiserver-{APISERVER_VERSION}"
        )
        etcd = env.get("FRACGPU_ETCD")
        return cls(
            in_ci=env.get("CI", "").lower() == "true",
            kube_apiserver=Path(apiserver),
            etcd=Path(etcd) if etcd else None,
            scratch_dir=_default_scratch_dir(env),
            keep_logs=env.get("FRACGPU_E2E_KEEP", "") not in ("", "0"),
        )
