"""The chart's shared files (webhook definitions, RBAC rules) are valid and say what the
design requires; the loader fills them in like the templates do."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import kubernetes.client
import pytest
import yaml

from agent.podlookup import KubernetesPodLookup
from fracgpu import __version__
from fracgpu.names import AGENT_READ_ANNOTATIONS, ANNOTATION_PREFIX
from tests.chart import chartfiles
from tests.chart.chartfiles import Names, webhook_configurations, webhooks_document

RBAC_RULE_KEYS = {"apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"}
RBAC_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}


def _hooks() -> list[dict]:  # type: ignore[type-arg]
    mutating, validating = webhook_configurations("https://127.0.0.1:9443", b"PEM")
    return mutating["webhooks"] + validating["webhooks"]


def test_mutating_webhook_definition() -> None:
    mutating, _ = webhook_configurations("https://127.0.0.1:9443/", b"PEM")
    assert mutating["kind"] == "MutatingWebhookConfiguration"
    assert mutating["metadata"]["name"] == "fracgpu-mutating"
    (hook,) = mutating["webhooks"]
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        },
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods/ephemeralcontainers"],
            "scope": "Namespaced",
        },
    ]
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["clientConfig"]["url"] == "https://127.0.0.1:9443/mutate"


def test_validating_webhook_definition() -> None:
    _, validating = webhook_configurations("https://127.0.0.1:9443", b"PEM")
    assert validating["metadata"]["name"] == "fracgpu-validating"
    create, update = validating["webhooks"]
    assert create["name"] == "validate.fracgpu.io"
    assert [(r["operations"], r["resources"]) for r in create["rules"]] == [
        (["CREATE"], ["pods"]),
        (["UPDATE"], ["pods/ephemeralcontainers"]),
    ]
    assert update["name"] == chartfiles.UPDATE_HOOK
    assert [(r["operations"], r["resources"]) for r in update["rules"]] == [(["UPDATE"], ["pods"])]
    for hook in validating["webhooks"]:
        assert "reinvocationPolicy" not in hook  # only mutating webhooks have it
        assert hook["clientConfig"]["url"] == "https://127.0.0.1:9443/validate"


def test_an_outage_blocks_only_creates_and_debug_containers() -> None:
    # What failurePolicy Fail (the default) covers: pod creates and added debug containers.
    # Deletion, status, finalizer removal and other updates of existing pods must never
    # wait for the webhook: no hook names DELETE, a subresource other than
    # ephemeralcontainers, or a wildcard, and the hook that sees UPDATEs of the pod itself
    # ignores an outage by default.
    for hook in _hooks():
        for rule in hook["rules"]:
            assert "DELETE" not in rule["operations"] and "*" not in rule["operations"]
            assert set(rule["resources"]) <= {"pods", "pods/ephemeralcontainers"}, rule
            if "UPDATE" in rule["operations"] and "pods" in rule["resources"]:
                assert hook["failurePolicy"] == "Ignore", hook["name"]
            else:
                assert hook["failurePolicy"] == "Fail", hook["name"]


def test_scope_values_reach_every_hook() -> None:
    extra = {"key": "team", "operator": "In", "values": ["ml"]}
    scope = chartfiles.Scope(
        failure_policy="Ignore",
        update_failure_policy="Fail",
        namespace_selector={
            "matchLabels": {"fracgpu.io/managed": "true"},
            "matchExpressions": [extra],
        },
        object_selector={"matchLabels": {"gpu": "yes"}},
    )
    mutating, validating = webhook_configurations("https://x", b"P", scope=scope)
    for hook in mutating["webhooks"] + validating["webhooks"]:
        expected = "Fail" if hook["name"] == chartfiles.UPDATE_HOOK else "Ignore"
        assert hook["failurePolicy"] == expected
        selector = hook["namespaceSelector"]
        assert selector["matchLabels"] == {"fracgpu.io/managed": "true"}
        # The built-in exemptions stay; the values only add to them.
        assert [e["key"] for e in selector["matchExpressions"]] == [
            "kubernetes.io/metadata.name",
            "fracgpu.io/ignore",
            "team",
        ]
        assert hook["objectSelector"] == {"matchLabels": {"gpu": "yes"}}
    plain, _ = webhook_configurations("https://x", b"P")
    assert "objectSelector" not in plain["webhooks"][0]
    assert "matchLabels" not in plain["webhooks"][0]["namespaceSelector"]


@pytest.mark.parametrize("field", ["sideEffects", "admissionReviewVersions"])
def test_common_settings(field: str) -> None:
    expected = {"sideEffects": "NoneOnDryRun"}
    for hook in _hooks():
        if field == "admissionReviewVersions":
            assert hook[field] == ["v1"]
        else:
            assert hook[field] == expected[field]
        assert 1 <= hook["timeoutSeconds"] <= 30


def test_names_are_unique_and_qualified() -> None:
    names = [hook["name"] for hook in _hooks()]
    assert len(set(names)) == len(names)
    assert all(name.count(".") >= 2 for name in names)  # the API server requires a FQDN


def test_namespace_selector_exempts_system_and_own_namespaces() -> None:
    names = Names(release_namespace="gpu-system", extra_exempt_namespaces=("team-ops",))
    mutating, validating = webhook_configurations("https://x", b"PEM", names=names)
    for hook in mutating["webhooks"] + validating["webhooks"]:
        expressions = hook["namespaceSelector"]["matchExpressions"]
        by_key = {e["key"]: e for e in expressions}
        by_name = by_key["kubernetes.io/metadata.name"]
        assert by_name["operator"] == "NotIn"
        assert by_name["values"] == [
            *chartfiles.SYSTEM_NAMESPACES,
            "gpu-system",
            "team-ops",
        ]
        opt_out = by_key["fracgpu.io/ignore"]
        assert opt_out == {"key": "fracgpu.io/ignore", "operator": "NotIn", "values": ["true"]}


def test_ca_bundle_is_base64_of_the_pem() -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n"
    for hook in webhook_configurations("https://x", pem)[0]["webhooks"]:
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == pem
    as_text = webhook_configurations("https://x", pem.decode())[1]["webhooks"][0]
    assert base64.b64decode(as_text["clientConfig"]["caBundle"]) == pem


def test_match_conditions_name_every_resource() -> None:
    names = Names(resource_names=("example.com/a", "example.com/b"))
    mutating, _ = webhook_configurations("https://x", b"P", names=names, match_conditions=True)
    (condition,) = mutating["webhooks"][0]["matchConditions"]
    assert "['example.com/a', 'example.com/b']" in condition["expression"]
    assert "__" not in condition["expression"]
    plain, _ = webhook_configurations("https://x", b"P")
    assert "matchConditions" not in plain["webhooks"][0]


def test_the_update_hook_is_sent_only_changes_of_what_fracgpu_checks() -> None:
    _, validating = webhook_configurations("https://x", b"P", match_conditions=True)
    create, update = validating["webhooks"]
    assert create["matchConditions"][0]["name"] == "gpu-pods-and-fracgpu-metadata"
    (condition,) = update["matchConditions"]
    assert condition["name"] == "changes-what-fracgpu-checks"
    for side in ("object", "oldObject"):
        for kind in ("annotations", "labels"):
            assert f"{side}.metadata.{kind}.exists(k" in condition["expression"]
    assert "tolerations" not in condition["expression"]
    _, tainted = webhook_configurations(
        "https://x",
        b"P",
        scope=chartfiles.Scope(match_conditions=True, gpu_node_taint="fracgpu.io/gpu-node"),
    )
    (condition,) = tainted["webhooks"][1]["matchConditions"]
    expression = condition["expression"]
    assert "size(object.spec.tolerations) != size(oldObject.spec.tolerations)" in expression


# The CEL list literals of annotation keys the update condition sends changes of.
_KEY_LISTS = re.compile(r"k in (\[[^\]]*\])")


def test_the_update_condition_names_every_annotation_the_agent_reads() -> None:
    """An annotation the agent reads when a container restarts (HAMi's nvidia.com/priority)
    edited on a running pod: unless the update reaches the webhook, the next restart applies
    it (high priority) without the namespace's grant. fracgpu.io/ keys are sent by prefix;
    every other key the agent reads must be listed, in both annotation clauses."""
    (condition,) = webhooks_document()["updateMatchConditions"]
    outside = sorted(k for k in AGENT_READ_ANNOTATIONS if not k.startswith(ANNOTATION_PREFIX))
    assert outside == ["nvidia.com/priority"]
    lists = [yaml.safe_load(literal) for literal in _KEY_LISTS.findall(condition["expression"])]
    assert lists == [outside, outside]
    added, removed = condition["expression"].split("\n|| ")[:2]
    assert "object.metadata.annotations.exists(k" in added
    assert "oldObject.metadata.annotations.exists(k" in removed


class _ReadKeys(dict[str, str]):
    """Annotations that note every key read; reading them all at once is refused."""

    def __init__(self, values: dict[str, str]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.read.add(key)
        return super().get(key, default)

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the agent must read named annotations only")

    def keys(self) -> Any:
        raise AssertionError("the agent must read named annotations only")

    def items(self) -> Any:
        raise AssertionError("the agent must read named annotations only")


def test_the_agent_reads_only_the_annotations_named_in_fracgpu_names() -> None:
    """What the update condition above is held to is what the agent reads."""
    annotations = _ReadKeys({key: "x" for key in (*AGENT_READ_ANNOTATIONS, "other/key")})
    pod = SimpleNamespace(
        metadata=SimpleNamespace(annotations=annotations, uid="u"),
        spec=kubernetes.client.V1PodSpec(node_name="n", containers=[]),
    )
    api = SimpleNamespace(
        read_namespaced_pod=lambda *_, **__: pod, api_client=kubernetes.client.ApiClient()
    )
    KubernetesPodLookup(api).get("ns", "p")
    assert annotations.read == set(AGENT_READ_ANNOTATIONS)


def test_no_placeholder_is_left() -> None:
    document = webhooks_document()
    assert "__" not in repr(document)
    for component in chartfiles.COMPONENTS:
        assert "__" not in repr(chartfiles.rbac_document(component))


@pytest.mark.parametrize("component", chartfiles.COMPONENTS)
def test_rbac_rules_are_policy_rules(component: str) -> None:
    rules = chartfiles.cluster_rules(component) + chartfiles.namespace_rules(component)
    assert rules
    for rule in rules:
        assert set(rule) <= RBAC_RULE_KEYS, rule
        assert rule["apiGroups"] and rule["resources"] and rule["verbs"]
        assert set(rule["verbs"]) <= RBAC_VERBS, rule
        if "resourceNames" in rule:
            # RBAC cannot restrict create/list/watch by name: a rule claiming so misleads.
            assert not set(rule["verbs"]) & {"create", "list", "watch"}, rule


def test_certs_rules_are_limited_to_fracgpu_objects() -> None:
    names = Names(prefix="gpu")
    rules = chartfiles.cluster_rules("certs", names)
    assert chartfiles.rule_grants(
        rules,
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "update",
        "gpu-mutating",
    )
    assert not chartfiles.rule_grants(
        rules, "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "update", "other"
    )
    secrets = chartfiles.namespace_rules("certs", names)
    assert chartfiles.rule_grants(secrets, "", "secrets", "get", "gpu-webhook-ca")
    assert not chartfiles.rule_grants(secrets, "", "secrets", "get", "someone-elses")


def test_rbac_objects_bind_the_service_account() -> None:
    objects = chartfiles.rbac_objects("webhook", "fracgpu-system")
    kinds = [o["kind"] for o in objects]
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    for binding in (objects[1], objects[3]):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "fracgpu-webhook", "namespace": "fracgpu-system"}
        ]
    assert objects[2]["metadata"]["namespace"] == "fracgpu-system"
    # The agent needs no namespaced rules: no Role is made for it.
    assert [o["kind"] for o in chartfiles.rbac_objects("agent", "ns")] == [
        "ClusterRole",
        "ClusterRoleBinding",
    ]


def test_crds_are_the_charts() -> None:
    names = sorted(crd["metadata"]["name"] for crd in chartfiles.crds())
    assert names == ["gpunodes.fracgpu.io", "gpuquotas.fracgpu.io"]


def test_unknown_component_is_refused() -> None:
    with pytest.raises(ValueError, match="use one of webhook, agent, certs"):
        chartfiles.rbac_document("scheduler")


def test_chart_app_version_is_the_package_version() -> None:
    """The chart installs the images built from this version of the code: its appVersion is
    the one version string the package declares (``fracgpu.__version__``)."""
    chart = yaml.safe_load((chartfiles.CHART_DIR / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert chart["version"] == __version__
