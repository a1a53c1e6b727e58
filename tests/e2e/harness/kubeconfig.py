"""kubeconfig files for the harness's identities, for processes started by tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .identities import Identity

CLUSTER_NAME = "fracgpu-e2e"


def kubeconfig_document(
    server: str, ca_cert: Path, identities: Sequence[Identity], current: str
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [{"name": i.key, "user": {"token": i.token}} for i in identities],
        "contexts": [
            {"name": i.key, "context": {"cluster": CLUSTER_NAME, "user": i.key}} for i in identities
        ],
        "current-context": current,
    }


def write_kubeconfig(
    path: Path, server: str, ca_cert: Path, identities: Sequence[Identity], current: str
) -> Path:
    path.write_text(yaml.safe_dump(kubeconfig_document(server, ca_cert, identities, current)))
    path.chmod(0o600)
    return path
