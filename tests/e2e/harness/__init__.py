"""A real control plane (etcd + kube-apiserver on loopback) for fracgpu's end-to-end tests."""

from .binaries import Binaries, MissingBinaryError, locate_binaries, require_binaries
from .config import E2EConfig
from .controlplane import ControlPlane
from .identities import DEFAULT_IDENTITIES, Identity
from .resources import (
    CRD_DIR,
    apply_crds,
    create_gpunode,
    create_namespace,
    create_node,
    create_resource_quota,
    fake_devices,
    gpu_allocatable,
)

__all__ = [
    "CRD_DIR",
    "DEFAULT_IDENTITIES",
    "Binaries",
    "ControlPlane",
    "E2EConfig",
    "Identity",
    "MissingBinaryError",
    "apply_crds",
    "create_gpunode",
    "create_namespace",
    "create_node",
    "create_resource_quota",
    "fake_devices",
    "gpu_allocatable",
    "locate_binaries",
    "require_binaries",
]
