"""Queue mode in the chart (issue 21): the fracgpu scheduler runs as a sidecar of every
webhook replica, configured from a ConfigMap to call the extender on the pod's loopback
only, with the built-in scheduler roles; off by default (immediate placement)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fracgpu import names
from tests.chart import chartfiles
from tests.chart.render import Rendered, render
from tests.chart.render_setup import renderer_or_skip
from tests.e2e.scheduler_harness import scheduler_configuration

QUEUE = {"webhook": {"queue": {"enabled": True}}}


@pytest.fixture(scope="module")
def renderer() -> Path:
    return renderer_or_skip()


def deployment(rendered: Rendered) -> dict[str, Any]:
    return rendered.one("Deployment", "fracgpu-webhook")


def containers(rendered: Rendered) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment(rendered)["spec"]["template"]["spec"]["containers"]}


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_queue_mode_is_off_by_default(renderer: Path) -> None:
    rendered = render(renderer=renderer)
    assert set(containers(rendered)) == {"webhook"}
    webhook = env(containers(rendered)["webhook"])
    assert webhook["FRACGPU_PLACEMENT_MODE"] == "immediate"
    assert webhook["FRACGPU_EXTENDER_PORT"] == "0"  # no extender at all
    assert not rendered.find("ConfigMap", "fracgpu-webhook-scheduler")


def test_the_scheduler_sidecar_calls_the_extender_on_loopback_only(renderer: Path) -> None:
    rendered = render(renderer=renderer, values=QUEUE)
    sidecar = containers(rendered)["scheduler"]
    assert sidecar["image"].startswith("registry.k8s.io/kube-scheduler:")
    assert "--config=/etc/fracgpu/scheduler/config.yaml" in sidecar["command"]
    assert "--secure-port=0" in sidecar["command"]  # no HTTPS serving in the pod
    webhook = env(containers(rendered)["webhook"])
    assert webhook["FRACGPU_PLACEMENT_MODE"] == "queue"
    assert webhook["FRACGPU_SCHEDULER_NAME"] == names.DEFAULT_SCHEDULER_NAME
    port = int(webhook["FRACGPU_EXTENDER_PORT"])
    config_map = rendered.one("ConfigMap", "fracgpu-webhook-scheduler")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == f"http://127.0.0.1:{port}"
    # The end-to-end tests run the stock binary with the same profile and extender.
    tested = scheduler_configuration("", extender["urlPrefix"])
    assert config["profiles"] == tested["profiles"]
    assert config["extenders"] == tested["extenders"]
    assert config["leaderElection"]["leaderElect"] is True
    for served in ("healthzBindAddress", "metricsBindAddress"):
        assert config[served].startswith("127.0.0.1:"), served
        assert config[served] == tested[served]
    # No Service port reaches the extender: it is not a container port either.
    ports = {p["containerPort"] for c in containers(rendered).values() for p in c.get("ports", [])}
    assert port not in ports
    service = rendered.one("Service")
    assert port not in {p["targetPort"] for p in service["spec"]["ports"]}


def test_the_sidecar_has_the_built_in_scheduler_roles_and_its_lease(renderer: Path) -> None:
    rendered = render(renderer=renderer, values=QUEUE)
    bound = {
        b["roleRef"]["name"]: b["subjects"]
        for b in rendered.find("ClusterRoleBinding")
        if b["roleRef"]["name"].startswith("system:")
    }
    account = [{"kind": "ServiceAccount", "name": "fracgpu-webhook", "namespace": "fracgpu-system"}]
    assert bound == {"system:kube-scheduler": account, "system:volume-scheduler": account}
    role = rendered.one("Role", "fracgpu-webhook-scheduler")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [names.DEFAULT_SCHEDULER_NAME],
            "verbs": ["get", "update"],
        }
    ]


def test_only_queue_mode_grants_the_webhook_pod_writes(renderer: Path) -> None:
    immediate = render(renderer=renderer).one("ClusterRole", "fracgpu-webhook")["rules"]
    queued = render(renderer=renderer, values=QUEUE).one("ClusterRole", "fracgpu-webhook")["rules"]
    assert immediate == chartfiles.cluster_rules("webhook")
    assert queued == chartfiles.cluster_rules("webhook", queue=True)
    extra = chartfiles.queue_cluster_rules("webhook")
    assert extra and not any(rule in immediate for rule in extra)
