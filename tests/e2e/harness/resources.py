"""API objects the end-to-end tests need: CRDs, Nodes, GPUNodes, namespaces, quotas."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml
from kubernetes.client.exceptions import ApiException

from .kube import as_dict, body

CRD_DIR = Path(__file__).resolve().parents[3] / "charts" / "fracgpu" / "crds"
FRACGPU_GROUP = "fracgpu.io"
FRACGPU_VERSION = "v1alpha1"
# TKEStack's canonical resource names, the defaults of fracgpu's configuration.
CORE_RESOURCE = "tencent.com/vcuda-core"
MEMORY_RESOURCE = "tencent.com/vcuda-memory"
MEMORY_BLOCK_MIB = 256
HTTP_CONFLICT = 409
EDITOR_CLUSTER_ROLES = ("system:aggregate-to-edit", "system:aggregate-to-view")
HTTP_NOT_FOUND = 404


def _load_crds(directory: Path) -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            if document.get("kind") != "CustomResourceDefinition":
                raise ValueError(
                    f"{path}: expected only CustomResourceDefinition documents, "
                    f"found kind {document.get('kind')!r}"
                )
            documents.append(document)
    if not documents:
        raise ValueError(f"no CustomResourceDefinition YAML found in {directory}")
    return documents


def _replace_crd(api: kubernetes.client.ApiextensionsV1Api, document: dict[str, Any]) -> None:
    name = document["metadata"]["name"]
    current = api.read_custom_resource_definition(name)
    version = current.metadata.resource_version if current.metadata else None
    metadata = {**document["metadata"], "resourceVersion": version}
    api.replace_custom_resource_definition(name, body({**document, "metadata": metadata}))


def _crd_conditions(api: kubernetes.client.ApiextensionsV1Api, name: str) -> dict[str, str]:
    crd = api.read_custom_resource_definition(name)
    conditions = (crd.status.conditions if crd.status else None) or []
    return {c.type: c.status for c in conditions}


def apply_crds(
    client: kubernetes.client.ApiClient, directory: Path = CRD_DIR, timeout: float = 60.0
) -> list[str]:
    """Create or update every CRD in `directory`; return their names once served."""
    api = kubernetes.client.ApiextensionsV1Api(client)
    names: list[str] = []
    for document in _load_crds(directory):
        name = document["metadata"]["name"]
        try:
            api.create_custom_resource_definition(body(document))
        except ApiException as error:
            if error.status != HTTP_CONFLICT:
                raise
            _replace_crd(api, document)
        names.append(name)

    deadline = time.monotonic() + timeout
    for document in _load_crds(directory):
        name = document["metadata"]["name"]
        while True:
            conditions = _crd_conditions(api, name)
            if (
                conditions.get("Established") == "True"
                and conditions.get("NamesAccepted") == "True"
            ):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not established after {timeout}s: {conditions}")
            time.sleep(0.1)
        _wait_served(client, document, deadline)
    return names


def _wait_served(
    client: kubernetes.client.ApiClient, crd: Mapping[str, Any], deadline: float
) -> None:
    # Established can precede the REST endpoint by a moment: list until it answers.
    custom = kubernetes.client.CustomObjectsApi(client)
    spec = crd["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("served", True))
    while True:
        try:
            # Lists across namespaces for namespaced kinds, which is all we need here.
            custom.list_cluster_custom_object(spec["group"], version, spec["names"]["plural"])
            return
        except ApiException as error:
            if error.status != HTTP_NOT_FOUND or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def gpu_allocatable(
    gpus: int,
    memory_mib_per_gpu: int,
    core_resource: str = CORE_RESOURCE,
    memory_resource: str = MEMORY_RESOURCE,
    block_mib: int = MEMORY_BLOCK_MIB,
) -> dict[str, str]:
    """Node allocatable for `gpus` GPUs in canonical units (100 cores, 256 MiB blocks each)."""
    if gpus < 0 or memory_mib_per_gpu < 0:
        raise ValueError(f"gpus and memory must be >= 0, got {gpus} and {memory_mib_per_gpu}")
    return {
        core_resource: str(100 * gpus),
        memory_resource: str(gpus * (memory_mib_per_gpu // block_mib)),
    }


def create_node(
    client: kubernetes.client.ApiClient,
    name: str,
    *,
    cpu: str = "64",
    memory: str = "256Gi",
    pods: str = "110",
    extended: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> kubernetes.client.V1Node:
    """A Ready Node API object (no kubelet behind it) with the given capacity/allocatable."""
    resources = {"cpu": cpu, "memory": memory, "pods": pods, **(extended or {})}
    api = kubernetes.client.CoreV1Api(client)
    node_object = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
        },
        "spec": {},
    }
    api.create_node(body(node_object))
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "fracgpu e2e: API object only, no kubelet",
                }
            ],
        }
    }
    api.patch_node_status(name, body(status))
    # The TaintNodesByCondition admission plugin taints every new Node not-ready; the node
    # lifecycle controller (not run here) lifts it once the node reports Ready.
    return api.patch_node(name, body({"spec": {"taints": None}}))


def create_gpunode(
    client: kubernetes.client.ApiClient,
    name: str,
    devices: Sequence[Mapping[str, Any]],
    *,
    spec: Mapping[str, Any] | None = None,
    driver_version: str = "535.129.03",
    cuda_driver_version: str = "12.2",
) -> dict[str, Any]:
    """A GPUNode as the node agent would publish it: created, then status via /status."""
    custom = kubernetes.client.CustomObjectsApi(client)
    gpunode = {
        "apiVersion": f"{FRACGPU_GROUP}/{FRACGPU_VERSION}",
        "kind": "GPUNode",
        "metadata": {"name": name},
        "spec": dict(spec or {}),
    }
    custom.create_cluster_custom_object(FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", gpunode)
    status = {
        "status": {
            "devices": [dict(d) for d in devices],
            "driverVersion": driver_version,
            "cudaDriverVersion": cuda_driver_version,
            "updatedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    }
    return as_dict(
        custom.patch_cluster_custom_object_status(
            FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", name, status
        )
    )


def fake_devices(
    node: str, count: int, *, model: str = "NVIDIA A100-SXM4-40GB", memory_mib: int = 40960
) -> list[dict[str, Any]]:
    """`count` healthy devices with stable, node-unique UUIDs."""
    return [
        {
            "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{index}')}",
            "index": index,
            "model": model,
            "memoryMiB": memory_mib,
            "healthy": True,
            "migEnabled": False,
            "pciBusId": f"00000000:{0x10 + index:02X}:00.0",
        }
        for index in range(count)
    ]


def create_namespace(
    client: kubernetes.client.ApiClient,
    prefix: str = "e2e",
    labels: Mapping[str, str] | None = None,
    editors: Iterable[str] = (),
) -> str:
    """A fresh namespace; `editors` (user names) get what the built-in `edit` role grants."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespace(body({"metadata": {"name": name, "labels": dict(labels or {})}}))
    users = list(editors)
    if users:
        rbac = kubernetes.client.RbacAuthorizationV1Api(client)
        # The built-in `edit` role is filled by kube-controller-manager's aggregation
        # controller, which does not run here: bind the roles it aggregates instead.
        for role in EDITOR_CLUSTER_ROLES:
            rbac.create_namespaced_role_binding(
                name,
                body(
                    {
                        "metadata": {"name": f"e2e-editors-{role.rsplit(':', 1)[-1]}"},
                        "roleRef": {
                            "apiGroup": "rbac.authorization.k8s.io",
                            "kind": "ClusterRole",
                            "name": role,
                        },
                        "subjects": [
                            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                            for user in users
                        ],
                    }
                ),
            )
        for user in users:
            _wait_authorized(client, user, namespace=name, verb="create", resource="pods")
    return name


def _allowed(review: kubernetes.client.V1SubjectAccessReview) -> bool:
    return review.status is not None and bool(review.status.allowed)


def _wait_authorized(
    client: kubernetes.client.ApiClient,
    user: str,
    *,
    namespace: str,
    verb: str,
    resource: str,
    timeout: float = 10.0,
) -> None:
    # The RBAC authorizer reads bindings from an informer: a new binding takes a moment.
    api = kubernetes.client.AuthorizationV1Api(client)
    review = {
        "spec": {
            "user": user,
            "resourceAttributes": {"namespace": namespace, "verb": verb, "resource": resource},
        }
    }
    deadline = time.monotonic() + timeout
    while not _allowed(api.create_subject_access_review(body(review))):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{user} still may not {verb} {resource} in {namespace}")
        time.sleep(0.05)


def create_resource_quota(
    client: kubernetes.client.ApiClient, namespace: str, hard: Mapping[str, str], name: str = "e2e"
) -> kubernetes.client.V1ResourceQuota:
    """A ResourceQuota that admission enforces at once.

    Without kube-controller-manager nobody fills in status.hard, and the ResourceQuota
    admission plugin refuses pods while a quota's status is unknown; write it ourselves.
    """
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespaced_resource_quota(
        namespace, body({"metadata": {"name": name}, "spec": {"hard": dict(hard)}})
    )
    status = {"status": {"hard": dict(hard), "used": {key: "0" for key in hard}}}
    return core.patch_namespaced_resource_quota_status(name, namespace, body(status))


def create_gpuquota(
    client: kubernetes.client.ApiClient,
    namespace: str,
    hard: Mapping[str, int],
    name: str = "gpu",
    **spec: Any,
) -> dict[str, Any]:
    """A GPUQuota with ``spec.hard`` (cores, memoryMiB, gpus) in ``namespace``, plus any other
    spec fields given (``models``, ``pools``)."""
    return as_dict(
        kubernetes.client.CustomObjectsApi(client).create_namespaced_custom_object(
            FRACGPU_GROUP,
            FRACGPU_VERSION,
            namespace,
            "gpuquotas",
            {
                "apiVersion": f"{FRACGPU_GROUP}/{FRACGPU_VERSION}",
                "kind": "GPUQuota",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"hard": dict(hard), **spec},
            },
        )
    )


def gpuquota_used(
    client: kubernetes.client.ApiClient, namespace: str, name: str = "gpu"
) -> dict[str, int]:
    """A GPUQuota's status.used as the API returns it ({} before anything is charged)."""
    obj = as_dict(
        kubernetes.client.CustomObjectsApi(client).get_namespaced_custom_object(
            FRACGPU_GROUP, FRACGPU_VERSION, namespace, "gpuquotas", name
        )
    )
    return dict((obj.get("status") or {}).get("used") or {})
