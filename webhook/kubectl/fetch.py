"""Reads from the Kubernetes API (and the node agent's metrics, through the API server's pod
proxy) for the kubectl plugin. Everything comes back as plain JSON dicts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kubernetes.client
import kubernetes.config
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from fracgpu import names
from webhook.kubectl.report import ContainerUsage

Obj = dict[str, Any]
AGENT_SELECTOR = "app.kubernetes.io/component=agent,app.kubernetes.io/name=fracgpu"


class FetchError(Exception):
    """An API request failed; the message says which and why."""


def connect(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
    """An ApiClient and the context's default namespace (kubectl's rules: KUBECONFIG too)."""
    config: Any = kubernetes.config  # the loaders are untyped
    try:
        client = config.new_client_from_config(config_file=kubeconfig, context=context)
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        if context is not None:
            contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
            active = next((c for c in contexts if c["name"] == context), active)
    except (config.ConfigException, OSError) as error:
        raise FetchError(f"cannot load the kubeconfig: {error}") from None
    namespace = str((active or {}).get("context", {}).get("namespace") or "default")
    return client, namespace


def _as_dict(client: Any, obj: Any) -> Obj:
    plain = client.sanitize_for_serialization(obj)
    if not isinstance(plain, dict):
        raise FetchError(f"unexpected API answer of type {type(plain).__name__}")
    return plain


def _call(what: str, request: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return request(*args, **kwargs)
    except ApiException as error:
        reason = error.reason or ""
        if error.status == 404:
            raise FetchError(f"{what}: not found") from None
        if error.status == 403:
            raise FetchError(f"{what}: forbidden ({reason}); ask for read access") from None
        raise FetchError(f"{what}: {error.status} {reason}") from None
    except OSError as error:
        raise FetchError(f"{what}: cannot reach the API server ({error})") from None


def gpunodes(client: Any) -> list[Obj]:
    api = kubernetes.client.CustomObjectsApi(client)
    listed = _call(
        "list GPUNodes",
        api.list_cluster_custom_object,
        names.GROUP,
        names.CRD_VERSION,
        names.GPUNODE_PLURAL,
    )
    return list(listed.get("items", []))


def gpunode(client: Any, name: str) -> Obj | None:
    api = kubernetes.client.CustomObjectsApi(client)
    try:
        found: Obj = _call(
            f"get GPUNode {name}",
            api.get_cluster_custom_object,
            names.GROUP,
            names.CRD_VERSION,
            names.GPUNODE_PLURAL,
            name,
        )
    except FetchError as error:
        if str(error).endswith("not found"):
            return None
        raise
    return found


def assigned_pods(client: Any) -> list[Obj]:
    api = kubernetes.client.CoreV1Api(client)
    listed = _call(
        "list pods",
        api.list_pod_for_all_namespaces,
        label_selector=names.LABEL_MANAGED,
    )
    return [_as_dict(client, pod) for pod in listed.items]


def gpuquotas(client: Any, namespace: str | None) -> list[Obj]:
    api = kubernetes.client.CustomObjectsApi(client)
    if namespace is None:
        listed = _call(
            "list GPUQuotas",
            api.list_cluster_custom_object,
            names.GROUP,
            names.CRD_VERSION,
            names.GPUQUOTA_PLURAL,
        )
    else:
        listed = _call(
            f"list GPUQuotas in {namespace}",
            api.list_namespaced_custom_object,
            names.GROUP,
            names.CRD_VERSION,
            namespace,
            names.GPUQUOTA_PLURAL,
        )
    return list(listed.get("items", []))


def pod(client: Any, namespace: str, name: str) -> Obj:
    api = kubernetes.client.CoreV1Api(client)
    return _as_dict(
        client, _call(f"pod {namespace}/{name}", api.read_namespaced_pod, name, namespace)
    )


def container_usage(
    client: Any, node: str, fracgpu_namespace: str, namespace: str, pod_name: str
) -> tuple[Mapping[str, tuple[ContainerUsage, ...]], str]:
    """Live usage of a pod's containers from the agent on its node, and a note for people.

    The agent's Prometheus endpoint is read through the API server's pod proxy (needs
    get on pods/proxy in fracgpu's namespace); when that is not possible the note says why.
    """
    api = kubernetes.client.CoreV1Api(client)
    try:
        agents = _call(
            f"list agent pods in {fracgpu_namespace}",
            api.list_namespaced_pod,
            fracgpu_namespace,
            label_selector=AGENT_SELECTOR,
            field_selector=f"spec.nodeName={node}",
        ).items
        if not agents:
            return {}, f"not available: no fracgpu agent pod on node {node} in {fracgpu_namespace}"
        agent = agents[0]
        port = next(
            (
                p.container_port
                for c in agent.spec.containers
                for p in (c.ports or [])
                if p.name == "metrics"
            ),
            None,
        )
        if port is None:
            return {}, f"not available: agent pod {agent.metadata.name} has no metrics port"
        text = _call(
            f"read metrics of {agent.metadata.name}",
            api.connect_get_namespaced_pod_proxy_with_path,
            f"{agent.metadata.name}:{port}",
            fracgpu_namespace,
            "metrics",
        )
    except FetchError as error:
        return {}, f"not available: {error}"
    usage = parse_usage(str(text), namespace, pod_name)
    if not usage:
        return {}, "the agent reports no usage for this pod yet (not started, or not running)"
    return usage, f"from agent {agent.metadata.name}"


def parse_usage(text: str, namespace: str, pod_name: str) -> dict[str, tuple[ContainerUsage, ...]]:
    """Per container, per GPU figures from the agent's metrics text for one pod."""
    fields = {
        "fracgpu_container_memory_used_bytes": "memory_used_bytes",
        "fracgpu_container_memory_limit_bytes": "memory_limit_bytes",
        "fracgpu_container_utilization_ratio": "utilization_ratio",
        "fracgpu_container_oom_rejections_total": "oom_rejections",
    }
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
