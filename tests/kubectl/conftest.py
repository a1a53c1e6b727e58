"""The end-to-end fixtures (real etcd + kube-apiserver) for this directory's e2e tests.

They are defined in tests/e2e/conftest.py, whose fixtures pytest scopes to tests/e2e/;
re-exported here so the plugin runs against the same kind of control plane.
"""

from tests.e2e.conftest import (
    control_plane,
    e2e_config,
    fracgpu_crds,
    kube_client,
    kubeconfig,
    namespace,
    nodes,
)

__all__ = [
    "control_plane",
    "e2e_config",
    "fracgpu_crds",
    "kube_client",
    "kubeconfig",
    "namespace",
    "nodes",
]
