"""REST paths of the objects fracgpu reads and writes."""

from fracgpu import names

_CRD_BASE = f"/apis/{names.GROUP}/{names.CRD_VERSION}"
PODS = "/api/v1/pods"
NODES = "/api/v1/nodes"
NAMESPACES = "/api/v1/namespaces"
GPUNODES = f"{_CRD_BASE}/{names.GPUNODE_PLURAL}"
GPUQUOTAS = f"{_CRD_BASE}/{names.GPUQUOTA_PLURAL}"


def gpunode_status(name: str) -> str:
    return f"{GPUNODES}/{name}/status"


def gpuquotas_in(namespace: str) -> str:
    return f"{_CRD_BASE}/namespaces/{namespace}/{names.GPUQUOTA_PLURAL}"


def gpuquota(namespace: str, name: str) -> str:
    return f"{gpuquotas_in(namespace)}/{name}"


def gpuquota_status(namespace: str, name: str) -> str:
    return f"{gpuquota(namespace, name)}/status"


def pods_in(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def pod(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def pod_binding(namespace: str, name: str) -> str:
    return f"{pod(namespace, name)}/binding"


def pod_status(namespace: str, name: str) -> str:
    return f"{pod(namespace, name)}/status"


def events_in(namespace: str) -> str:
    return f"{NAMESPACES}/{namespace}/events"
