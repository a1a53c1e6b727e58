"""The chart's own object definitions, for tests that apply them to a real API server.

The Helm templates include these same files (charts/fracgpu/files/), so what the end-to-end
suite registers is what a Helm install registers; only the per-install parts (names, where
the webhook is reached, the CA bundle) are filled in here, as the templates fill them in.

API (all return plain JSON-shaped dicts, ready for the kubernetes client):

- ``webhook_configurations(url, ca_bundle, ...)`` -> ``(mutating, validating)``: the
  MutatingWebhookConfiguration and ValidatingWebhookConfiguration, reaching the webhook at
  ``url`` + ``/mutate`` / ``/validate``.
- ``cluster_rules(component, queue=...)`` / ``namespace_rules(component)``: the PolicyRules
  of ``"webhook"``, ``"agent"`` or ``"certs"`` (ClusterRole and Role in fracgpu's namespace);
  ``queue_cluster_rules(component)``: what queue mode adds to the ClusterRole.
- ``rbac_objects(component, namespace, service_account, queue=...)``: ClusterRole,
  ClusterRoleBinding, Role and RoleBinding of one component bound to a ServiceAccount, as the
  chart makes them.
- ``crds()``: the CustomResourceDefinitions under charts/fracgpu/crds/.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from fracgpu.dialects import GPU_LOOKALIKES
from webhook.admission.shimguard import DEVICE_INJECTION_PREFIXES

CHART_DIR: Final = Path(__file__).resolve().parents[2] / "charts" / "fracgpu"
FILES_DIR: Final = CHART_DIR / "files"
WEBHOOKS_FILE: Final = FILES_DIR / "webhooks.yaml"
RBAC_DIR: Final = FILES_DIR / "rbac"
CRD_DIR: Final = CHART_DIR / "crds"
COMPONENTS: Final = ("webhook", "agent", "certs")
SYSTEM_NAMESPACES: Final = ("kube-system", "kube-public", "kube-node-lease")

Json = dict[str, Any]


@dataclass(frozen=True)
class Names:
    """Object names as the chart renders them for a release named "fracgpu"."""

    release_namespace: str = "fracgpu-system"
    prefix: str = "fracgpu"
    lease_name: str = "fracgpu-webhook"
    extra_exempt_namespaces: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = field(default_factory=tuple)

    @property
    def mutating(self) -> str:
        return f"{self.prefix}-mutating"

    @property
    def validating(self) -> str:
        return f"{self.prefix}-validating"

    @property
    def secret(self) -> str:
        return f"{self.prefix}-webhook-tls"

    @property
    def ca_secret(self) -> str:
        return f"{self.prefix}-webhook-ca"

    def service_account(self, component: str) -> str:
        return f"{self.prefix}-{component}"


UPDATE_HOOK: Final = "validate-update.fracgpu.io"


def default_values() -> Json:
    """The chart's values.yaml."""
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    if not isinstance(values, dict):
        raise ValueError("values.yaml must hold a mapping")
    return values


def default_resource_names() -> tuple[str, ...]:
    """Every resource name in the chart's default values (the CEL list of matchConditions)."""
    values = default_values()
    return tuple(values["resourceNames"][key] for key in sorted(values["resourceNames"]))


@dataclass(frozen=True)
class Scope:
    """What values.webhooks sets on every hook; the defaults are values.yaml's."""

    failure_policy: str = ""
    update_failure_policy: str = ""
    namespace_selector: Json = field(default_factory=dict)
    object_selector: Json = field(default_factory=dict)
    match_conditions: bool = False
    # values.webhook.gpuNodeTaint (its key; "": none): with it the create hooks' condition
    # also sends pods bound by name or tolerating the taint, the update hook's updates that
    # add tolerations.
    gpu_node_taint: str = ""

    def policies(self) -> tuple[str, str]:
        defaults = default_values()["webhooks"]
        return (
            self.failure_policy or defaults["failurePolicy"],
            self.update_failure_policy or defaults["updateFailurePolicy"],
        )


def _cel_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def _filled(text: str, replacements: Mapping[str, str]) -> str:
    for placeholder, value in replacements.items():
        text = text.replace(placeholder, value)
    return text


def webhooks_document(names: Names = Names(), scope: Scope = Scope()) -> Json:
    """files/webhooks.yaml with its placeholders filled, as the template fills them."""
    exempt = ", ".join((names.release_namespace, *names.extra_exempt_namespaces))
    resources = names.resource_names or default_resource_names()
    cel_list = _cel_list(resources)
    failure, update_failure = scope.policies()
    text = _filled(
        WEBHOOKS_FILE.read_text(),
        {
            "__EXEMPT_NAMESPACES__": exempt,
            "__GPU_RESOURCES__": cel_list,
            "__GPU_DOMAINS__": _cel_list(f"{domain}/" for domain in GPU_LOOKALIKES),
            "__DEVICE_INJECTION__": _cel_list(DEVICE_INJECTION_PREFIXES),
            "__UPDATE_FAILURE_POLICY__": update_failure,
            "__FAILURE_POLICY__": failure,
            "__GPU_NODE_TAINT__": scope.gpu_node_taint,
            "__SCHEDULER_NAME__": default_values()["webhook"]["queue"]["schedulerName"],
        },
    )
    document = yaml.safe_load(text)
    if not isinstance(document, dict):
        raise ValueError(f"{WEBHOOKS_FILE} must hold a mapping")
    return document


def _ca_bundle_b64(ca_bundle: bytes | str) -> str:
    raw = ca_bundle.encode() if isinstance(ca_bundle, str) else ca_bundle
    return base64.b64encode(raw).decode()


def webhook_configurations(
    url: str,
    ca_bundle: bytes | str,
    *,
    names: Names = Names(),
    match_conditions: bool = False,
    timeout_seconds: int | None = None,
    scope: Scope | None = None,
) -> tuple[Json, Json]:
    """(MutatingWebhookConfiguration, ValidatingWebhookConfiguration) calling ``url``.

    ``url`` is the webhook's base URL (``https://127.0.0.1:8443``); ``ca_bundle`` the PEM
    of the CA that signed its serving certificate (bytes or str; base64-encoded here).
    ``scope`` stands for values.webhooks' policies and selectors (``match_conditions`` is a
    shorthand for its field of that name).
    """
    scope = scope or Scope(match_conditions=match_conditions)
    document = webhooks_document(names, scope)
    bundle = _ca_bundle_b64(ca_bundle)
    base = url.rstrip("/")
    result = []
    for kind, name, key, path in (
        ("MutatingWebhookConfiguration", names.mutating, "mutating", "/mutate"),
        ("ValidatingWebhookConfiguration", names.validating, "validating", "/validate"),
    ):
        hooks = []
        for hook in copy.deepcopy(document[key]):
            hook["clientConfig"] = {"url": base + path, "caBundle": bundle}
            if timeout_seconds is not None:
                hook["timeoutSeconds"] = timeout_seconds
            _apply_scope(hook, scope, document)
            hooks.append(hook)
        result.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "fracgpu"}},
                "webhooks": hooks,
            }
        )
    return result[0], result[1]


def _apply_scope(hook: Json, scope: Scope, document: Json) -> None:
    """What the template adds from values.webhooks: selectors and matchConditions."""
    namespaces = hook["namespaceSelector"]
    extra = scope.namespace_selector
    namespaces["matchExpressions"] += copy.deepcopy(extra.get("matchExpressions") or [])
    if extra.get("matchLabels"):
        namespaces["matchLabels"] = dict(extra["matchLabels"])
    if scope.object_selector:
        hook["objectSelector"] = copy.deepcopy(scope.object_selector)
    if scope.match_conditions:
        key = "updateMatchConditions" if hook["name"] == UPDATE_HOOK else "matchConditions"
        hook["matchConditions"] = copy.deepcopy(document[key])
        if scope.gpu_node_taint:
            added = (
                "updateTolerationsCondition"
                if hook["name"] == UPDATE_HOOK
                else ("createTaintCondition")
            )
            first = hook["matchConditions"][0]
            first["expression"] += " || " + document[added]


def rbac_document(component: str, names: Names = Names()) -> Json:
    """files/rbac/<component>.yaml with its placeholders filled."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}: use one of {', '.join(COMPONENTS)}")
    text = _filled(
        (RBAC_DIR / f"{component}.yaml").read_text(),
        {
            "__LEASE_NAME__": names.lease_name,
            "__CA_SECRET__": names.ca_secret,
            "__SECRET__": names.secret,
            "__MUTATING__": names.mutating,
            "__VALIDATING__": names.validating,
        },
    )
    document = yaml.safe_load(text)
    if not isinstance(document, dict):
        raise ValueError(f"files/rbac/{component}.yaml must hold a mapping")
    return document


def cluster_rules(component: str, names: Names = Names(), *, queue: bool = False) -> list[Json]:
    """The component's ClusterRole rules; ``queue``: as in queue mode (with queueClusterRules)."""
    rules = list(rbac_document(component, names).get("clusterRules") or [])
    return rules + queue_cluster_rules(component, names) if queue else rules


def queue_cluster_rules(component: str, names: Names = Names()) -> list[Json]:
    """The rules only queue mode adds to the component's ClusterRole."""
    return list(rbac_document(component, names).get("queueClusterRules") or [])


def namespace_rules(component: str, names: Names = Names()) -> list[Json]:
    return list(rbac_document(component, names).get("namespaceRules") or [])


def rbac_objects(
    component: str,
    namespace: str,
    service_account: str | None = None,
    names: Names | None = None,
    *,
    queue: bool = False,
) -> list[Json]:
    """ClusterRole(+Binding) and Role(+Binding) of one component, as the chart renders them
    (``queue``: in queue mode).

    The Role and RoleBinding live in ``namespace`` (fracgpu's own); both bindings name the
    ServiceAccount ``service_account`` (default ``<prefix>-<component>``) in ``namespace``.
    """
    names = names or Names(release_namespace=namespace)
    name = f"{names.prefix}-{component}"
    account = service_account or names.service_account(component)
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    objects: list[Json] = []
    rules = cluster_rules(component, names, queue=queue)
    if rules:
        objects.append(_rbac("ClusterRole", name, None, rules=rules))
        objects.append(
            _rbac("ClusterRoleBinding", name, None, role=("ClusterRole", name), subjects=subject)
        )
    rules = namespace_rules(component, names)
    if rules:
        objects.append(_rbac("Role", name, namespace, rules=rules))
        objects.append(_rbac("RoleBinding", name, namespace, role=("Role", name), subjects=subject))
    return objects


def _rbac(
    kind: str,
    name: str,
    namespace: str | None,
    *,
    rules: list[Json] | None = None,
    role: tuple[str, str] | None = None,
    subjects: list[Json] | None = None,
) -> Json:
    metadata: Json = {"name": name, "labels": {"app.kubernetes.io/name": "fracgpu"}}
    if namespace is not None:
        metadata["namespace"] = namespace
    obj: Json = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": metadata}
    if rules is not None:
        obj["rules"] = copy.deepcopy(rules)
    if role is not None:
        obj["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": role[0], "name": role[1]}
        obj["subjects"] = subjects or []
    return obj


def crds() -> list[Json]:
    """The chart's CustomResourceDefinitions (one per file under crds/)."""
    return [_single_document(path) for path in sorted(CRD_DIR.glob("*.yaml"))]


def _single_document(path: Path) -> Json:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise ValueError(f"{path} must hold exactly one object")
    return documents[0]


def rule_grants(rules: Iterable[Json], group: str, resource: str, verb: str, name: str) -> bool:
    """Whether any rule allows ``verb`` on ``group``/``resource`` named ``name`` (RBAC logic)."""
    for rule in rules:
        if group not in rule.get("apiGroups", []) and "*" not in rule.get("apiGroups", []):
            continue
        if resource not in rule.get("resources", []) and "*" not in rule.get("resources", []):
            continue
        if verb not in rule.get("verbs", []) and "*" not in rule.get("verbs", []):
            continue
        allowed_names = rule.get("resourceNames") or []
        if allowed_names and name not in allowed_names:
            continue
        return True
    return False
