"""The chart rendered with Helm's template engine (tests/chart/render), then checked: every
profile renders, the objects are what the design requires, the rendered settings are accepted
by each component's own settings loader, and the shared files are used as they are.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from agent.settings import parse_settings, unknown_variables
from certs.commandline import parse_command_line
from tests.chart import chartfiles
from tests.chart.render import (
    Rendered,
    RenderError,
    build_renderer,
    render,
)
from tests.chart.render_setup import renderer_or_skip
from webhook import settings as webhook_settings

HAMI = chartfiles.CHART_DIR / "values-hami.yaml"
MONITORING = {
    "monitoring": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
    }
}
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "hami": {"value_files": [HAMI]},
    "cert-manager": {"values": {"certs": {"mode": "certManager"}}},
    "cert-manager-issuer": {
        "values": {
            "certs": {
                "mode": "certManager",
                "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}},
            }
        }
    },
    "external-certs": {"values": {"certs": {"mode": "external"}}},
    "monitoring": {"values": MONITORING},
    "match-conditions": {
        "values": {"webhooks": {"matchConditions": {"enabled": True}}},
        "kube_version": "v1.29.0",
    },
    "match-conditions-taint": {
        "values": {
            "webhooks": {"matchConditions": {"enabled": True}},
            "webhook": {"gpuNodeTaint": "fracgpu.io/gpu-node"},
        },
        "kube_version": "v1.29.0",
    },
    "privileged-agent": {"values": {"agent": {"privileged": True}}},
    "gpu-node-taint": {"values": {"webhook": {"gpuNodeTaint": "fracgpu.io/gpu-node"}}},
    "webhook-scope": {
        "values": {
            "webhooks": {
                "failurePolicy": "Ignore",
                "updateFailurePolicy": "Fail",
                "namespaceSelector": {"matchLabels": {"fracgpu.io/managed": "true"}},
                "objectSelector": {
                    "matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["no"]}]
                },
            }
        }
    },
    "slice-audit-kill": {"values": {"agent": {"sliceAudit": {"kill": True}}}},
    "context-overhead": {"values": {"agent": {"contextOverheadBytes": 512 << 20}}},
    "node-defaults": {"values": {"webhook": {"memoryScaling": 2.5, "disableCoreLimit": True}}},
    "other-release": {"name": "gpu", "namespace": "gpu-platform"},
    "queue": {"values": {"webhook": {"queue": {"enabled": True}}}},
    "host-dirs": {
        "values": {"agent": {"kubeletRootDir": "/var/lib/k0s/kubelet", "hostDir": "/opt/fracgpu"}}
    },
}


@pytest.fixture(scope="session")
def renderer() -> Path:
    return renderer_or_skip()


@pytest.fixture(scope="session")
def rendered(renderer: Path) -> dict[str, Rendered]:
    return {name: render(renderer=renderer, **options) for name, options in PROFILES.items()}


def _container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    containers = obj["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


POD_IP = "10.1.2.3"


def _env(container: dict[str, Any], downward: dict[str, str]) -> dict[str, str]:
    """The container's environment as kubelet builds it: downward-API fields filled in and
    ``$(NAME)`` references to earlier variables expanded."""
    fields = {"status.podIP": POD_IP, **downward}
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            value = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: env.get(m.group(1), m.group(0)),
                str(entry["value"]),
            )
            env[entry["name"]] = value
        else:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


@pytest.mark.parametrize("profile", list(PROFILES))
def test_profile_renders_named_objects(rendered: dict[str, Rendered], profile: str) -> None:
    objects = rendered[profile].objects()
    assert objects
    for obj in objects:
        assert obj["apiVersion"] and obj["kind"] and obj["metadata"]["name"], obj
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), "two objects with the same kind and name"


def test_match_conditions_refuse_old_clusters(renderer: Path) -> None:
    with pytest.raises(RenderError, match=r"needs Kubernetes 1\.28"):
        render(renderer=renderer, values={"webhooks": {"matchConditions": {"enabled": True}}})


def test_an_install_without_a_registry_is_refused_with_what_to_do(renderer: Path) -> None:
    """No images are published: a default registry would only turn a missed --set into
    ImagePullBackOff on every node."""
    with pytest.raises(RenderError, match=r"image\.registry is not set") as refused:
        render(renderer=renderer, installed=False)
    assert "--set image.registry=" in str(refused.value)
    assert "docs/quickstart.md" in str(refused.value)


def test_every_fracgpu_image_comes_from_the_registry_set(renderer: Path) -> None:
    rendered = render(renderer=renderer, installed=False, values={"image": {"registry": "r.io"}})
    images = {
        c["image"]
        for o in rendered.objects()
        if o["kind"] in ("Deployment", "DaemonSet", "Job")
        for c in o["spec"]["template"]["spec"]["containers"]
        if "fracgpu-" in c["image"]
    }
    assert images == {"r.io/fracgpu/fracgpu-webhook:0.1.0", "r.io/fracgpu/fracgpu-agent:0.1.0"}


SCOPES = {
    "default": chartfiles.Scope(),
    "other-release": chartfiles.Scope(),
    "webhook-scope": chartfiles.Scope(
        failure_policy="Ignore",
        update_failure_policy="Fail",
        namespace_selector={"matchLabels": {"fracgpu.io/managed": "true"}},
        object_selector={
            "matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["no"]}]
        },
    ),
    "match-conditions": chartfiles.Scope(match_conditions=True),
    "match-conditions-taint": chartfiles.Scope(
        match_conditions=True, gpu_node_taint="fracgpu.io/gpu-node"
    ),
}


@pytest.mark.parametrize("profile", list(SCOPES))
def test_webhook_configurations_are_the_shared_file(
    rendered: dict[str, Rendered], profile: str
) -> None:
    options = PROFILES[profile]
    result = rendered[profile]
    prefix = "fracgpu" if profile != "other-release" else "gpu-fracgpu"
    names = chartfiles.Names(
        release_namespace=options.get("namespace", "fracgpu-system"), prefix=prefix
    )
    expected = chartfiles.webhook_configurations(
        "https://unused", b"x", names=names, scope=SCOPES[profile]
    )
    for want in expected:
        got = result.one(want["kind"], want["metadata"]["name"])
        for hook_got, hook_want in zip(got["webhooks"], want["webhooks"], strict=True):
            service = hook_got.pop("clientConfig")["service"]
            hook_want.pop("clientConfig")
            assert hook_got == hook_want
            assert service["name"] == f"{prefix}-webhook"
            assert service["namespace"] == names.release_namespace
            assert service["port"] == 443
            assert service["path"] in ("/mutate", "/validate")
            assert "caBundle" not in service  # owned by fracgpu-certs / cert-manager


def test_webhook_scope_values_are_rendered(rendered: dict[str, Rendered]) -> None:
    hooks = {
        hook["name"]: hook
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for hook in rendered["webhook-scope"].one(kind)["webhooks"]
    }
    assert {name: hook["failurePolicy"] for name, hook in hooks.items()} == {
        "mutate.fracgpu.io": "Ignore",
        "validate.fracgpu.io": "Ignore",
        chartfiles.UPDATE_HOOK: "Fail",
    }
    for hook in hooks.values():
        assert hook["namespaceSelector"]["matchLabels"] == {"fracgpu.io/managed": "true"}
        assert hook["objectSelector"]["matchExpressions"][0]["key"] == "gpu"
        names = hook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert "kube-system" in names and "fracgpu-system" in names


def test_match_conditions_are_rendered(rendered: dict[str, Rendered]) -> None:
    result = rendered["match-conditions"]
    (mutate,) = result.one("MutatingWebhookConfiguration")["webhooks"]
    create, update = result.one("ValidatingWebhookConfiguration")["webhooks"]
    for hook in (mutate, create):
        (condition,) = hook["matchConditions"]
        assert "'tencent.com/vcuda-core'" in condition["expression"]
        assert "'nvidia.com/gpu'" in condition["expression"]
    (condition,) = update["matchConditions"]
    assert "oldObject.metadata.annotations" in condition["expression"]
    # HAMi's priority annotation, which the agent reads when a container restarts
    assert "k in ['nvidia.com/priority']" in condition["expression"]
    assert "tolerations" not in condition["expression"]  # no gpu-node-taint: not needed


def test_with_gpu_node_taint_updates_adding_tolerations_are_sent(
    rendered: dict[str, Rendered],
) -> None:
    """A pod without GPUs may come to tolerate the GPU nodes' taint by an update: the update
    hook must be sent such updates for the webhook to refuse them."""
    hooks = rendered["match-conditions-taint"].one("ValidatingWebhookConfiguration")["webhooks"]
    (condition,) = hooks[1]["matchConditions"]
    plain = rendered["match-conditions"].one("ValidatingWebhookConfiguration")["webhooks"][1]
    (without,) = plain["matchConditions"]
    assert condition["name"] == without["name"]
    assert condition["expression"] == (
        without["expression"]
        + " || (has(object.spec.tolerations) && (!has(oldObject.spec.tolerations) ||\n"
        "  size(object.spec.tolerations) != size(oldObject.spec.tolerations)))"
    )


@pytest.mark.parametrize("component", chartfiles.COMPONENTS)
def test_rendered_rbac_is_the_shared_file(rendered: dict[str, Rendered], component: str) -> None:
    result = rendered["default"]
    name = f"fracgpu-{component}"
    # the default is immediate mode: no queue grants
    assert result.one("ClusterRole", name)["rules"] == chartfiles.cluster_rules(component)
    namespaced = chartfiles.namespace_rules(component)
    if namespaced:
        assert result.one("Role", name)["rules"] == namespaced
    else:
        assert result.find("Role", name) == []


def test_webhook_deployment_is_hardened(rendered: dict[str, Rendered]) -> None:
    deployment = rendered["default"].one("Deployment", "fracgpu-webhook")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "fracgpu-webhook"
    assert pod["affinity"]["podAntiAffinity"]
    container = _container(deployment, "webhook")
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}
    assert container["resources"]["requests"]
    (tls,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == "fracgpu-webhook-tls"
    pdb = rendered["default"].one("PodDisruptionBudget", "fracgpu-webhook")
    assert pdb["apiVersion"] == "policy/v1beta1"  # Kubernetes 1.20
    assert pdb["spec"]["minAvailable"] == 1


def test_agent_gets_host_access_it_needs_and_no_more(rendered: dict[str, Rendered]) -> None:
    daemonset = rendered["default"].one("DaemonSet", "fracgpu-agent")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia-device-enable": "enable"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {
        "device-plugins": "/var/lib/kubelet/device-plugins",
        "pod-resources": "/var/lib/kubelet/pod-resources",
        "kubelet-pods": "/var/lib/kubelet/pods",  # the region volumes, read
        "fracgpu-host": "/var/lib/fracgpu",
        "host-proc": "/proc",  # the slice audit maps NVML's host PIDs to pods
    }
    container = _container(daemonset, "agent")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["pod-resources"]["readOnly"] is True
    # Region volumes are tmpfs mounts kubelet makes after the agent started: propagated in.
    assert mounts["kubelet-pods"]["readOnly"] is True
    assert mounts["kubelet-pods"]["mountPropagation"] == "HostToContainer"
    assert mounts["host-proc"]["readOnly"] is True
    security = container["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    # FOWNER: what a container left in an older agent's region directory can be removed
    # whoever made it.
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["FOWNER"]}
    assert security["readOnlyRootFilesystem"] is True
    privileged = rendered["privileged-agent"].one("DaemonSet")
    assert _container(privileged, "agent")["securityContext"]["privileged"] is True


def test_agent_probes_its_readiness_and_health(rendered: dict[str, Rendered]) -> None:
    """kubelet marks an agent that has not registered its plugins as not ready (``/readyz``)
    and restarts only one that no longer answers (``/healthz``), on the metrics port."""
    container = _container(rendered["default"].one("DaemonSet", "fracgpu-agent"), "agent")
    assert [p["name"] for p in container["ports"]] == ["metrics"]
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}


def test_the_slice_audit_kills_only_from_the_hosts_pid_namespace(
    rendered: dict[str, Rendered],
) -> None:
    daemonset = rendered["slice-audit-kill"].one("DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert "host-proc" not in {v["name"] for v in pod["volumes"]}
    container = _container(daemonset, "agent")
    assert container["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["FOWNER", "KILL"],
    }
    settings = parse_settings([], _env(container, {"spec.nodeName": "gpu-1"}))
    assert settings.slice_audit_kill and str(settings.slice_audit_proc_dir) == "/proc"
    default = parse_settings(
        [], _env(_container(rendered["default"].one("DaemonSet"), "agent"), {"spec.nodeName": "n"})
    )
    assert not default.slice_audit_kill and str(default.slice_audit_proc_dir) == "/host/proc"


def test_webhook_settings_are_accepted_by_the_webhook(rendered: dict[str, Rendered]) -> None:
    for profile in ("default", "hami", "other-release"):
        prefix = "gpu-fracgpu" if profile == "other-release" else "fracgpu"
        deployment = rendered[profile].one("Deployment", f"{prefix}-webhook")
        env = _env(_container(deployment, "webhook"), {"metadata.name": "webhook-0"})
        settings = webhook_settings.load(None, env)
        known = {option.env for option in webhook_settings.OPTIONS}
        ours = {name for name in env if name.startswith(webhook_settings.ENV_PREFIX)}
        assert ours <= known, f"{profile}: unknown variables {ours - known}"
        assert settings.in_cluster and settings.identity == "webhook-0"
        # Followers reach the leader on its pod IP, at the port the webhook listens on.
        assert settings.advertise_url == f"https://{POD_IP}:{settings.port}"
        namespace = PROFILES[profile].get("namespace", "fracgpu-system")
        assert settings.lease_namespace == namespace
        assert settings.service_accounts == {
            f"system:serviceaccount:{namespace}:{prefix}-webhook",
            f"system:serviceaccount:{namespace}:{prefix}-agent",
        }
        if profile == "hami":
            assert settings.dialects.names.vcuda_core == "fracgpu.io/vcuda-core"


def test_node_defaults_reach_the_webhook(rendered: dict[str, Rendered]) -> None:
    """webhook.memoryScaling / webhook.disableCoreLimit become the webhook's node defaults."""
    expected = {"default": (1.0, False), "hami": (1.0, False), "node-defaults": (2.5, True)}
    for profile, (scaling, no_pacing) in expected.items():
        deployment = rendered[profile].one("Deployment", "fracgpu-webhook")
        env = _env(_container(deployment, "webhook"), {"metadata.name": "w"})
        settings = webhook_settings.load(None, env)
        assert (settings.memory_scaling, settings.disable_core_limit) == (scaling, no_pacing)
        assert "FRACGPU_MEMORY_SCALING" in env and "FRACGPU_DISABLE_CORE_LIMIT" in env


def test_the_gpu_node_taint_reaches_the_webhook(rendered: dict[str, Rendered]) -> None:
    """webhook.gpuNodeTaint: empty by default (no toleration written), else the key."""
    for profile, key in (("default", ""), ("gpu-node-taint", "fracgpu.io/gpu-node")):
        deployment = rendered[profile].one("Deployment", "fracgpu-webhook")
        env = _env(_container(deployment, "webhook"), {"metadata.name": "w"})
        assert webhook_settings.load(None, env).gpu_node_taint == key


# Webhook settings the default chart sets otherwise than the code's defaults, and why.
DEPLOYMENT_SETTINGS = {
    "tls_cert_file": "the certificate Secret's mount",
    "tls_key_file": "the certificate Secret's mount",
    "in_cluster": "the pod's service account",
    "advertise_url": "the pod's IP, for the leader's peers",
    "extender_port": "0: the scheduler extender serves only with webhook.queue.enabled",
}


def test_the_default_chart_keeps_the_webhooks_defaults(rendered: dict[str, Rendered]) -> None:
    """A value the chart sets to something else than the webhook's own default would be a
    second default, and docs/configuration.md describes the webhook's."""
    deployment = rendered["default"].one("Deployment", "fracgpu-webhook")
    chart = webhook_settings.load(
        None, _env(_container(deployment, "webhook"), {"metadata.name": "w"})
    )
    code = webhook_settings.load(None, {"FRACGPU_IDENTITY": "w"})
    differ = {
        f.name for f in dataclasses.fields(chart) if getattr(chart, f.name) != getattr(code, f.name)
    }
    assert differ == set(DEPLOYMENT_SETTINGS)


def test_the_webhook_protects_the_directories_the_agent_uses(
    rendered: dict[str, Rendered],
) -> None:
    """agent.kubeletRootDir and agent.hostDir move the agent's sockets and files; the webhook
    must refuse hostPath mounts of wherever they are (an unprotected copy would let a pod
    rewrite a neighbour's limits file or talk to kubelet)."""
    for profile, kubelet in (
        ("default", "/var/lib/kubelet"),
        ("host-dirs", "/var/lib/k0s/kubelet"),
    ):
        agent_env = _env(
            _container(rendered[profile].one("DaemonSet"), "agent"), {"spec.nodeName": "n"}
        )
        agent = parse_settings([], agent_env)
        deployment = rendered[profile].one("Deployment", "fracgpu-webhook")
        env = _env(_container(deployment, "webhook"), {"metadata.name": "w"})
        protected = webhook_settings.load(None, env).protected_host_paths
        used = (
            agent.device_plugin_dir,
            agent.pod_resources_socket,
            agent.host_lib_dir,
            agent.host_state_dir,
            agent.host_node_dir,
        )
        for path in used:
            assert any(path.is_relative_to(p) for p in protected), (profile, path, protected)
        assert agent.device_plugin_dir == Path(kubelet, "device-plugins")


def test_the_context_overhead_reaches_the_agent(rendered: dict[str, Rendered]) -> None:
    """agent.contextOverheadBytes: auto by default (None: the agent measures it), else the
    bytes."""
    for profile, overhead in (("default", None), ("context-overhead", 512 << 20)):
        env = _env(
            _container(rendered[profile].one("DaemonSet"), "agent"), {"spec.nodeName": "gpu-1"}
        )
        assert parse_settings([], env).context_overhead_bytes == overhead


def test_agent_settings_are_accepted_by_the_agent(rendered: dict[str, Rendered]) -> None:
    for profile in ("default", "hami"):
        env = _env(
            _container(rendered[profile].one("DaemonSet"), "agent"), {"spec.nodeName": "gpu-1"}
        )
        settings = parse_settings([], env)
        assert settings.node_name == "gpu-1"
        webhook = _env(
            _container(rendered[profile].one("Deployment", "fracgpu-webhook"), "webhook"),
            {"metadata.name": "w"},
        )
        # The agent advertises the resources the webhook rewrites pods to.
        assert settings.compute_resource == webhook["FRACGPU_RESOURCE_VCUDA_CORE"]
        assert settings.memory_resource == webhook["FRACGPU_RESOURCE_VCUDA_MEMORY"]
        assert str(settings.device_plugin_dir) == "/var/lib/kubelet/device-plugins"
        # Every FRACGPU_AGENT_* variable names a real flag (a typo would be ignored silently).
        # The agent ignores unknown variables, but not unknown flags: try each as a flag.
        for name, value in env.items():
            if name.startswith("FRACGPU_AGENT_"):
                flag = "--" + name.removeprefix("FRACGPU_AGENT_").lower().replace("_", "-")
                parse_settings([f"{flag}={value}"], {"NODE_NAME": "n"})


def test_certs_settings_are_accepted_by_fracgpu_certs(rendered: dict[str, Rendered]) -> None:
    result = rendered["default"]
    job = result.one("Job", "fracgpu-certs-hook")
    container = _container(job, "certs")
    assert container["command"] == ["fracgpu-certs"] and container["args"] == ["ensure"]
    command = parse_command_line(container["args"], _env(container, {}))
    settings = command.settings
    assert settings.namespace == "fracgpu-system"
    assert settings.service == "fracgpu-webhook"
    assert settings.secret == "fracgpu-webhook-tls"
    assert settings.mutating_webhook == "fracgpu-mutating"
    assert settings.validating_webhook == "fracgpu-validating"
    assert settings.in_cluster
    hooks = job["metadata"]["annotations"]["helm.sh/hook"]
    assert hooks == "pre-upgrade,post-install,post-upgrade"
    # Before install the webhook configurations do not exist yet: that Job makes the
    # Secrets only, so the webhook pods can start (helm install --wait).
    early = result.one("Job", "fracgpu-certs-hook-secrets")
    assert early["metadata"]["annotations"]["helm.sh/hook"] == "pre-install"
    early_container = _container(early, "certs")
    early_settings = parse_command_line(["ensure"], _env(early_container, {})).settings
    assert early_settings.webhook_configurations == ()
    assert early_settings.secret == settings.secret
    controller = _container(result.one("Deployment", "fracgpu-certs"), "certs")
    assert controller["args"] == ["run"]
    assert parse_command_line(controller["args"], _env(controller, {})).settings == settings


def _certs_jobs(rendered: Rendered) -> list[dict[str, Any]]:
    """The certificate Jobs (the settings check runs in every certificate mode)."""
    return [
        job
        for job in rendered.find("Job")
        if job["metadata"]["labels"]["app.kubernetes.io/component"] == "certs"
    ]


def test_cert_manager_mode_replaces_the_jobs(rendered: dict[str, Rendered]) -> None:
    result = rendered["cert-manager"]
    assert _certs_jobs(rendered["default"]) != []
    assert _certs_jobs(result) == []
    certificate = result.one("Certificate", "fracgpu-webhook")
    assert certificate["spec"]["secretName"] == "fracgpu-webhook-tls"
    assert "fracgpu-webhook.fracgpu-system.svc" in certificate["spec"]["dnsNames"]
    mutating = result.one("MutatingWebhookConfiguration")
    injected = mutating["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert injected == "fracgpu-system/fracgpu-webhook"
    corp = rendered["cert-manager-issuer"]
    assert corp.find("Issuer") == []
    assert corp.one("Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
    }
    external = rendered["external-certs"]
    assert _certs_jobs(external) == [] and external.find("Certificate") == []


def test_monitoring_objects_use_the_shared_files(rendered: dict[str, Rendered]) -> None:
    result = rendered["monitoring"]
    rule = result.one("PrometheusRule")
    groups = [g["name"] for g in rule["spec"]["groups"]]
    assert groups == ["fracgpu.webhook", "fracgpu.gpus", "fracgpu.containers"]
    dashboard = result.one("ConfigMap", "fracgpu-dashboard")
    shipped = (chartfiles.FILES_DIR / "dashboards" / "fracgpu.json").read_text()
    assert dashboard["data"]["fracgpu.json"] == shipped.rstrip("\n")
    assert {m["metadata"]["name"] for m in result.find("PodMonitor")} == {
        "fracgpu-webhook",
        "fracgpu-agent",
    }


def test_notes_tell_how_to_check_the_install(rendered: dict[str, Rendered]) -> None:
    notes = rendered["default"].notes
    assert "kubectl get gpunodes" in notes
    assert "fracgpu.io/ignore=true" in notes  # 1.20 has no kubernetes.io/metadata.name
    assert "tencent.com/vcuda-core: 25" in notes
    newer = render(kube_version="v1.29.0", renderer=build_renderer()).notes
    assert "kubectl label namespace kube-system" not in newer


def test_user_roles(rendered: dict[str, Rendered], renderer: Path) -> None:
    result = rendered["default"]
    quota_view = result.one("ClusterRole", "fracgpu-quota-view")
    labels = quota_view["metadata"]["labels"]
    for role in ("view", "edit", "admin"):
        assert labels[f"rbac.authorization.k8s.io/aggregate-to-{role}"] == "true"
    assert quota_view["rules"] == [
        {"apiGroups": ["fracgpu.io"], "resources": ["gpuquotas"], "verbs": ["get", "list", "watch"]}
    ]
    metrics = result.one("Role", "fracgpu-agent-metrics")
    assert metrics["metadata"]["namespace"] == "fracgpu-system"
    off = render(renderer=renderer, values={"userRoles": {"enabled": False}})
    assert off.find("ClusterRole", "fracgpu-viewer") == []


@pytest.mark.parametrize("profile", ["default", "queue", "match-conditions-taint"])
def test_the_chart_sets_no_variable_its_components_would_call_misspelt(
    rendered: dict[str, Rendered], profile: str
) -> None:
    """Each component logs the FRACGPU_* variables that name none of its settings; the
    chart's own must never be among them."""
    objects = rendered[profile]
    webhook = _container(objects.one("Deployment", "fracgpu-webhook"), "webhook")
    agent = _container(objects.one("DaemonSet", "fracgpu-agent"), "agent")
    names_of = {"spec.nodeName": "gpu-1", "metadata.name": "p", "metadata.namespace": "n"}
    assert webhook_settings.unknown_variables(_env(webhook, names_of)) == []
    assert unknown_variables(_env(agent, names_of)) == []
