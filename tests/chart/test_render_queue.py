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
from tests.chart.render import Rendered, RenderError, render
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


def _scheduler_config(rendered: Rendered) -> dict[str, Any]:
    config_map = rendered.one("ConfigMap", "fracgpu-webhook-scheduler")
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return config


def _queue(tag: str, config_api_version: str = "") -> dict[str, Any]:
    scheduler = {"image": {"tag": tag}, "configApiVersion": config_api_version}
    return {"webhook": {"queue": {"enabled": True, "scheduler": scheduler}}}


GROUP = "kubescheduler.config.k8s.io"
# KubeSchedulerConfiguration's top-level fields per apiVersion (k8s.io/kube-scheduler/config
# types.go): v1beta3 and v1 dropped healthzBindAddress and metricsBindAddress with the
# insecure port (removed in 1.23); 1.23+ refuse them in v1beta2 unless their port is 0.
COMMON_FIELDS = {
    "apiVersion",
    "kind",
    "parallelism",
    "leaderElection",
    "clientConnection",
    "enableProfiling",
    "enableContentionProfiling",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "extenders",
}
INSECURE_PORT_FIELDS = {"healthzBindAddress", "metricsBindAddress"}
FIELDS = {
    f"{GROUP}/v1beta1": COMMON_FIELDS | INSECURE_PORT_FIELDS,
    f"{GROUP}/v1beta2": COMMON_FIELDS | INSECURE_PORT_FIELDS,
    f"{GROUP}/v1beta3": COMMON_FIELDS,
    f"{GROUP}/v1": COMMON_FIELDS,
}
EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
# The sidecar's kube-scheduler version -> the newest apiVersion it reads (KEP-785: v1beta1
# 1.19-1.22, v1beta2 1.22-1.27, v1beta3 1.23-1.28, v1 from 1.25).
NEWEST = {
    "v1.20.2": f"{GROUP}/v1beta1",
    "v1.21.14": f"{GROUP}/v1beta1",
    "v1.22.17": f"{GROUP}/v1beta2",
    "v1.24.17": f"{GROUP}/v1beta3",
    "v1.25.0": f"{GROUP}/v1",
    "v1.30.2": f"{GROUP}/v1",
}


@pytest.mark.parametrize("tag", list(NEWEST))
def test_the_scheduler_config_is_in_the_newest_api_its_version_reads(
    renderer: Path, tag: str
) -> None:
    config = _scheduler_config(render(renderer=renderer, values=_queue(tag)))
    assert config["apiVersion"] == NEWEST[tag]
    assert set(config) <= FIELDS[config["apiVersion"]], set(config) - FIELDS[config["apiVersion"]]
    for extender in config["extenders"]:
        assert set(extender) <= EXTENDER_FIELDS
    # Where the insecure port still exists (1.20-1.22) it serves on loopback only.
    if FIELDS[config["apiVersion"]] >= INSECURE_PORT_FIELDS:
        for served in INSECURE_PORT_FIELDS:
            assert config[served].startswith("127.0.0.1:"), served
    # The same scheduler whatever the version: one profile, the extender, leader election.
    baseline = _scheduler_config(render(renderer=renderer, values=QUEUE))
    for same in ("profiles", "extenders", "leaderElection"):
        assert config[same] == baseline[same], same


def test_the_1_20_scheduler_config_is_the_one_the_node_tier_runs(renderer: Path) -> None:
    """kube-scheduler 1.20.2 runs this configuration in the node tier: v1beta1, loopback."""
    config = _scheduler_config(render(renderer=renderer, values=_queue("v1.20.2")))
    assert config == {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "KubeSchedulerConfiguration",
        "healthzBindAddress": "127.0.0.1:10251",
        "metricsBindAddress": "127.0.0.1:10251",
        "leaderElection": {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceNamespace": "fracgpu-system",
            "resourceName": names.DEFAULT_SCHEDULER_NAME,
        },
        "profiles": [{"schedulerName": names.DEFAULT_SCHEDULER_NAME}],
        "extenders": [
            {
                "urlPrefix": "http://127.0.0.1:8889",
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "bindVerb": "bind",
                "weight": 1,
                "enableHTTPS": False,
                "nodeCacheCapable": True,
                "ignorable": False,
                "managedResources": [
                    {"name": names.RESOURCE_VCUDA_CORE, "ignoredByScheduler": True},
                    {"name": names.RESOURCE_VCUDA_MEMORY, "ignoredByScheduler": True},
                ],
            }
        ],
    }


@pytest.mark.parametrize("tag", ["latest", "sha256-3f1c9e", "v1.28.3_custom"])
def test_a_tag_that_is_no_version_needs_the_api_version_named(renderer: Path, tag: str) -> None:
    with pytest.raises(RenderError, match=r"configApiVersion") as refused:
        render(renderer=renderer, values=_queue(tag))
    message = str(refused.value)
    assert f'"{tag}" is not a kube-scheduler version' in message
    for api in FIELDS:
        assert api in message  # what may be set
    named = f"{GROUP}/v1beta3"
    config = _scheduler_config(render(renderer=renderer, values=_queue(tag, named)))
    assert config["apiVersion"] == named
    assert not INSECURE_PORT_FIELDS & set(config)


def test_a_named_api_version_must_be_one_the_tag_reads(renderer: Path) -> None:
    older = _scheduler_config(
        render(renderer=renderer, values=_queue("v1.25.0", f"{GROUP}/v1beta3"))
    )
    assert older["apiVersion"] == f"{GROUP}/v1beta3"
    for tag, api in (("v1.30.2", "v1beta1"), ("v1.24.17", "v1beta2"), ("v1.20.2", "v1")):
        with pytest.raises(RenderError, match=rf'configApiVersion "{GROUP}/{api}" does not fit'):
            render(renderer=renderer, values=_queue(tag, f"{GROUP}/{api}"))


def test_a_scheduler_older_than_1_20_is_refused(renderer: Path) -> None:
    with pytest.raises(RenderError, match=r"needs kube-scheduler 1\.20 or later"):
        render(renderer=renderer, values=_queue("v1.19.16"))
