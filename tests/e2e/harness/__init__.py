"""A real control plane (etcd + kube-apiserver on loopback) for fracgpu's end-to-end tests.

Binaries: etcd from Debian's etcd-server (scripts/install-system-deps.sh) and kube-apiserver
1.20.2 built by scripts/build-kube-apiserver.sh into ~/.cache/fracgpu. Environment:
FRACGPU_KUBE_APISERVER / FRACGPU_ETCD (binary paths), FRACGPU_CACHE (cache dir),
FRACGPU_E2E_TMPDIR (scratch, default /dev/shm), FRACGPU_E2E_KEEP=1 (keep logs and data of
a run for debugging), CI=true (missing binaries fail instead of skip).

What the apiserver runs with: token authentication for the identities in identities.py
(admin in system:masters; webhook and agent as fracgpu-system service-account users;
tenant/tenant2 as plain users), authorization Node,RBAC, admission incl.
MutatingAdmissionWebhook, ValidatingAdmissionWebhook and ResourceQuota (ServiceAccount
disabled: no controller-manager). No kubelet, scheduler or controller-manager: pods stay
Pending, namespaces never finish terminating, built-in aggregated roles (edit/view/admin)
have no rules, and ResourceQuota status must be seeded (create_resource_quota does it).
"""

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
