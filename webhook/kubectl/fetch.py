"""Reads from the Kubernetes API (and the node agent's metrics, through the API server's pod
proxy) for the kubectl plugin. Everything comes back as plain JSON dicts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fracgpu import names
from webhook.kubectl import kubeapi
from webhook.kubectl.report import ContainerUsage

Obj = dict[str, Any]
AGENT_SELECTOR = "app.kubernetes.io/component=agent,app.kubernetes.io/name=fracgpu"
CRD_PATH = f"/apis/{names.GROUP}/{names.CRD_VERSION}"


class FetchError(Exception):
    """An API request failed; the message says which and why."""


def connect(kubeconfig: str | None, context: str | None) -> tuple[kubeapi.KubeClient, str]:
    """A client and the context's default namespace (kubectl's rules: KUBECONFIG too)."""
    try:
        credentials = kubeapi.load(kubeconfig, context)
        return kubeapi.KubeClient(credentials), credentials.namespace
    except kubeapi.KubeConfigError as error:
        raise FetchError(f"cannot load the kubeconfig: {error}") from None


def _call(what: str, request: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return request(*args, **kwargs)
    except kubeapi.KubeApiError as error:
        if error.status == 404:
            raise FetchError(f"{what}: not found") from None
        if error.status == 403:
            raise FetchError(f"{what}: forbidden ({error.reason}); ask for read access") from None
        if error.status == 0:
            raise FetchError(f"{what}: {error.reason}") from None
        raise FetchError(f"{what}: {error}") from None
    except ValueError as error:  # not JSON
        raise FetchError(f"{what}: unreadable answer ({error})") from None


def _items(listed: Any) -> list[Obj]:
    items = listed.get("items") if isinstance(listed, dict) else None
    return [item for item in items or [] if isinstance(item, dict)]


NO_CRDS = (
    ": the fracgpu CRDs are not installed in this cluster (install the chart, or "
    "kubectl apply -f charts/fracgpu/crds/)"
)


def _list_custom(client: kubeapi.KubeClient, what: str, path: str) -> list[Obj]:
    """A list of fracgpu objects; a 404 means the API server does not know the kind."""
    try:
        return _items(_call(what, client.get, path))
    except FetchError as error:
        if str(error).endswith("not found"):
            raise FetchError(f"{error}{NO_CRDS}") from None
        raise


def gpunodes(client: kubeapi.KubeClient) -> list[Obj]:
    return _list_custom(client, "list GPUNodes", f"{CRD_PATH}/{names.GPUNODE_PLURAL}")


def gpunode(client: kubeapi.KubeClient, name: str) -> Obj | None:
    try:
        found: Obj = _call(
            f"get GPUNode {name}", client.get, f"{CRD_PATH}/{names.GPUNODE_PLURAL}/{name}"
        )
    except FetchError as error:
        if str(error).endswith("not found"):
            return None
        raise
    return found


def assigned_pods(client: kubeapi.KubeClient, namespace: str | None = None) -> list[Obj]:
    """Pods fracgpu placed, in one namespace or (None) all."""
    where = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    what = f"list pods in {namespace}" if namespace else "list pods"
    return _items(_call(what, client.get, where, labelSelector=names.LABEL_MANAGED))


def gpuquotas(client: kubeapi.KubeClient, namespace: str | None) -> list[Obj]:
    if namespace is None:
        path, what = f"{CRD_PATH}/{names.GPUQUOTA_PLURAL}", "list GPUQuotas"
    else:
        path = f"{CRD_PATH}/namespaces/{namespace}/{names.GPUQUOTA_PLURAL}"
        what = f"list GPUQuotas in {namespace}"
    return _list_custom(client, what, path)


def pod(client: kubeapi.KubeClient, namespace: str, name: str) -> Obj:
    found = _call(
        f"pod {namespace}/{name}", client.get, f"/api/v1/namespaces/{namespace}/pods/{name}"
    )
    if not isinstance(found, dict):
        raise FetchError(f"pod {namespace}/{name}: unexpected answer")
    return found


def container_usage(
    client: kubeapi.KubeClient, node: str, fracgpu_namespace: str, namespace: str, pod_name: str
) -> tuple[Mapping[str, tuple[ContainerUsage, ...]], str]:
    """Live usage of a pod's containers from the agent on its node, and a note for people.

    The agent's Prometheus endpoint is read through the API server's pod proxy (needs
    get on pods/proxy in fracgpu's namespace); when that is not possible the note says why.
    """
    try:
        agents = _items(
            _call(
                f"list agent pods in {fracgpu_namespace}",
                client.get,
                f"/api/v1/namespaces/{fracgpu_namespace}/pods",
                labelSelector=AGENT_SELECTOR,
                fieldSelector=f"spec.nodeName={node}",
            )
        )
        if not agents:
            return {}, f"not available: no fracgpu agent pod on node {node} in {fracgpu_namespace}"
        agent = str((agents[0].get("metadata") or {}).get("name", ""))
        port = next(
            (
                p.get("containerPort")
                for c in (agents[0].get("spec") or {}).get("containers") or []
                for p in c.get("ports") or []
                if p.get("name") == "metrics"
            ),
            None,
        )
        if port is None:
            return {}, f"not available: agent pod {agent} has no metrics port"
        text = _call(
            f"read metrics of {agent}",
            client.get_text,
            f"/api/v1/namespaces/{fracgpu_namespace}/pods/{agent}:{port}/proxy/metrics",
        )
    except FetchError as error:
        return {}, f"not available: {error}"
    usage = parse_usage(str(text), namespace, pod_name)
    if not usage:
        return {}, "the agent reports no usage for this pod yet (not started, or not running)"
    return usage, f"from agent {agent}"


def parse_usage(text: str, namespace: str, pod_name: str) -> dict[str, tuple[ContainerUsage, ...]]:
    """Per container, per GPU figures from the agent's metrics text for one pod."""
    fields = {
        "fracgpu_container_memory_used_bytes": "memory_used_bytes",
        "fracgpu_container_memory_limit_bytes": "memory_limit_bytes",
        "fracgpu_container_utilization_ratio": "utilization_ratio",
        "fracgpu_container_oom_rejections_total": "oom_rejections",
    }
    # Only this command reads metrics text: the parser is imported here, not at start-up.
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    found: dict[tuple[str, str], dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = fields.get(sample.name)
            labels = sample.labels
            if field is None or labels.get("namespace") != namespace:
                continue
            if labels.get("pod") != pod_name:
                continue
            key = (labels.get("container", ""), labels.get("gpu", ""))
            value = sample.value if field == "utilization_ratio" else int(sample.value)
            found.setdefault(key, {})[field] = value
    usage: dict[str, list[ContainerUsage]] = {}
    for (container, gpu), values in sorted(found.items()):
        usage.setdefault(container, []).append(ContainerUsage(gpu=gpu, **values))
    return {container: tuple(items) for container, items in usage.items()}
