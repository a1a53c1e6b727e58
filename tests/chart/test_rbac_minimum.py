"""The chart's RBAC rules are exactly what each component's code calls: nothing missing,
nothing extra.

Each component's Kubernetes calls are found in its source: kubernetes-client methods (agent,
certs) and the webhook's own REST client (get/list/watch/create/replace/patch/delete on
paths from webhook/cluster/paths.py, and the watch caches). A call this test cannot classify
fails it, so a new API call is never missed silently.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from tests.chart.chartfiles import cluster_rules, namespace_rules, queue_cluster_rules

REPO = Path(__file__).resolve().parents[2]
Grant = tuple[str, str, str]  # (apiGroup, resource, verb)

_CLIENT_CLASSES = (
    kubernetes.client.CoreV1Api,
    kubernetes.client.CustomObjectsApi,
    kubernetes.client.AdmissionregistrationV1Api,
    kubernetes.client.CoordinationV1Api,
)
_CLIENT_VERBS = {
    "read": "get",
    "get": "get",
    "list": "list",
    "create": "create",
    "replace": "update",
    "patch": "patch",
    "delete": "delete",
}
_CORE_KINDS = {
    "pod": "pods",
    "secret": "secrets",
    "node": "nodes",
    "namespace": "namespaces",
    "config_map": "configmaps",
    "event": "events",
}
_ADMISSION_KINDS = {
    "mutating_webhook_configuration": "mutatingwebhookconfigurations",
    "validating_webhook_configuration": "validatingwebhookconfigurations",
}
_REST_VERBS = {
    "get": "get",
    "list": "list",
    "watch": "watch",
    "create": "create",
    "replace": "update",
    "patch": "patch",
    "delete": "delete",
}


def _sources(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if "proto" not in p.parts)


def _is_client_method(name: str) -> bool:
    return any(hasattr(cls, name) for cls in _CLIENT_CLASSES)


def _custom_resource(path: Path, text: str) -> str:
    plurals = {
        plural
        for constant, plural in (("GPUNODE_PLURAL", "gpunodes"), ("GPUQUOTA_PLURAL", "gpuquotas"))
        if constant in text
    }
    if len(plurals) != 1:
        pytest.fail(f"{path}: cannot tell which custom resource its custom-object calls use")
    return plurals.pop()


def _client_grant(path: Path, text: str, method: str) -> Grant:
    verb_word, _, rest = method.partition("_")
    verb = _CLIENT_VERBS.get(verb_word)
    if verb is None:
        pytest.fail(f"{path}: unknown kubernetes client verb in {method}")
    scope_free = (
        rest.removeprefix("namespaced_")
        .removesuffix("_with_http_info")
        .removesuffix("_for_all_namespaces")
    )
    subresource = ""
    if scope_free.endswith("_status"):
        scope_free, subresource = scope_free.removesuffix("_status"), "/status"
    if scope_free in ("cluster_custom_object", "namespaced_custom_object", "custom_object"):
        return ("fracgpu.io", _custom_resource(path, text) + subresource, verb)
    if scope_free in _CORE_KINDS:
        return ("", _CORE_KINDS[scope_free] + subresource, verb)
    if scope_free in _ADMISSION_KINDS:
        return ("admissionregistration.k8s.io", _ADMISSION_KINDS[scope_free], verb)
    pytest.fail(f"{path}: kubernetes client method {method} is not classified in this test")


def client_calls(package: str) -> set[Grant]:
    """Grants needed by kubernetes-client calls in a package."""
    needed = set()
    for path in _sources(package):
        text = path.read_text()
        for method in re.findall(r"\.((?:read|get|list|create|replace|patch|delete)_\w+)", text):
            if _is_client_method(method):
                needed.add(_client_grant(path, text, method))
    return needed


def _rest_resource(path: Path, argument: str) -> tuple[str, str]:
    checks = (
        ("gpunode_status", ("fracgpu.io", "gpunodes/status")),
        ("gpuquota_status", ("fracgpu.io", "gpuquotas/status")),
        ("GPUNODES", ("fracgpu.io", "gpunodes")),
        ("GPUQUOTAS", ("fracgpu.io", "gpuquotas")),
        ("gpuquotas_in", ("fracgpu.io", "gpuquotas")),
        ("gpuquota(", ("fracgpu.io", "gpuquotas")),
        ("pod_binding(", ("", "pods/binding")),
        ("pod_status(", ("", "pods/status")),
        ("events_in(", ("", "events")),
        ("PODS", ("", "pods")),
        ("paths.pod(", ("", "pods")),
        ("paths.pods_in(", ("", "pods")),
        ("NAMESPACES", ("", "namespaces")),
        ("NODES", ("", "nodes")),
        ("/leases", ("coordination.k8s.io", "leases")),
    )
    for marker, resource in checks:
        if marker in argument:
            return resource
    # The elector keeps its Lease path in a property.
    if path.name == "leader.py" and argument.strip() == "self._path":
        return ("coordination.k8s.io", "leases")
    pytest.fail(f"{path}: cannot classify the API path {argument.strip()!r}")


def webhook_calls(*, queue: bool | None = None) -> set[Grant]:
    """Grants needed by the webhook's REST client calls and watch caches; ``queue``: only
    those of webhook/queue (True) or only those outside it (False)."""
    needed = set()
    call = re.compile(
        r"\b(?:api|self\._api)\.(get|list|watch|create|replace|patch|delete)\(\s*([^,)]+)"
    )
    cache = re.compile(r"WatchCache\(\s*\w+,\s*([^,)]+)")
    for path in _sources("webhook"):
        if path.name in ("apiclient.py", "watchcache.py"):
            continue  # the generic client and cache: their paths come from callers
        if queue is not None and ("queue" in path.relative_to(REPO).parts) != queue:
            continue
        text = path.read_text()
        for verb, argument in call.findall(text):
            group, resource = _rest_resource(path, argument)
            needed.add((group, resource, _REST_VERBS[verb]))
        for argument in cache.findall(text):
            group, resource = _rest_resource(path, argument)
            needed |= {(group, resource, "list"), (group, resource, "watch")}
    return needed


def grants(rules: list[dict[str, Any]]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def granted(component: str, *, queue: bool = False) -> set[Grant]:
    return grants(cluster_rules(component, queue=queue) + namespace_rules(component))


def test_webhook_rules_are_exactly_what_it_calls() -> None:
    needed = webhook_calls()
    assert needed, "found no API calls in webhook/: the scan is broken"
    assert granted("webhook", queue=True) == needed


def test_only_queue_mode_is_granted_what_only_the_queue_calls() -> None:
    immediate = webhook_calls(queue=False)
    queue_only = webhook_calls(queue=True) - immediate
    assert queue_only, "found no API calls in webhook/queue: the scan is broken"
    assert granted("webhook") == immediate
    assert grants(queue_cluster_rules("webhook")) == queue_only


def test_agent_rules_are_exactly_what_it_calls() -> None:
    needed = client_calls("agent")
    assert needed, "found no API calls in agent/: the scan is broken"
    assert granted("agent") == needed


def test_certs_rules_are_exactly_what_it_calls() -> None:
    needed = client_calls("certs")
    assert needed, "found no API calls in certs/: the scan is broken"
    assert granted("certs") == needed


def test_no_component_can_read_secrets_except_certs() -> None:
    for component in ("webhook", "agent"):
        assert not any(resource == "secrets" for _, resource, _ in granted(component))


def test_no_wildcards() -> None:
    for component in ("webhook", "agent", "certs"):
        for rule in cluster_rules(component) + namespace_rules(component):
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], (component, rule)


def test_scan_classifies_known_calls() -> None:
    fake = Path("x.py")
    text = "names.GPUNODE_PLURAL"
    assert _client_grant(fake, text, "patch_cluster_custom_object_status") == (
        "fracgpu.io",
        "gpunodes/status",
        "patch",
    )
    assert _client_grant(fake, text, "replace_namespaced_secret") == ("", "secrets", "update")
    assert _rest_resource(fake, "paths.gpuquota_status(ns, name)") == (
        "fracgpu.io",
        "gpuquotas/status",
    )
