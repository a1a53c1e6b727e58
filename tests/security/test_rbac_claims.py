"""What no fracgpu service account can do, read from the chart's own RBAC files (the ones
the templates render and the end-to-end suite applies). That each rule is one the code
uses is tests/chart/test_rbac_minimum.py's job; this checks the ceiling."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.chartfiles import COMPONENTS, cluster_rules, namespace_rules

NEVER = {"delete", "deletecollection", "escalate", "bind", "impersonate", "*"}
WRITES = {"create", "update", "patch"}


def _rules(component: str, *, queue: bool = True) -> list[dict[str, Any]]:
    """Every rule of the component; by default as in queue mode, which is granted the most."""
    return [*cluster_rules(component, queue=queue), *namespace_rules(component)]


def _grants(rule: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (group, resource, verb)
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    ]


# Queue mode's extender binds a queued pod: it writes the assignment onto the pod, creates the
# Binding and says where the pod stands in its status (docs/security.md, RBAC table). No other
# pod write is granted to any component, and in immediate mode none at all.
QUEUE_POD_WRITES = {
    "webhook": {("", "pods", "patch"), ("", "pods/binding", "create"), ("", "pods/status", "patch")}
}


@pytest.mark.parametrize("queue", [False, True], ids=["immediate", "queue"])
@pytest.mark.parametrize("component", COMPONENTS)
def test_no_component_can_delete_escalate_or_write_pods(component: str, queue: bool) -> None:
    grants = [g for rule in _rules(component, queue=queue) for g in _grants(rule)]
    assert grants, f"{component} has no rules at all: the files were not read"
    assert not [g for g in grants if g[2] in NEVER]
    pod_writes = {
        g for g in grants if g[0] == "" and g[1].split("/")[0] == "pods" and g[2] in WRITES
    }
    assert pod_writes == (QUEUE_POD_WRITES.get(component, set()) if queue else set())
    assert not [g for g in grants if "*" in g[0] or "*" in g[1]]


@pytest.mark.parametrize("component", COMPONENTS)
def test_secrets_and_webhook_configurations_only_by_name_and_only_for_certs(
    component: str,
) -> None:
    sensitive = {"secrets", "mutatingwebhookconfigurations", "validatingwebhookconfigurations"}
    for rule in _rules(component):
        touched = sensitive & set(rule.get("resources", []))
        if not touched:
            continue
        assert component == "certs", f"{component} may touch {touched}"
        # Creating cannot be limited by name; everything else names the objects.
        assert rule.get("resourceNames") or set(rule["verbs"]) == {"create"}, rule
        assert not {"list", "watch"} & set(rule["verbs"]), rule
