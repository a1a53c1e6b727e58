"""kubectl fracgpu against a real kube-apiserver: GPUNodes, pods with assignments and a
GPUQuota created through the API, the plugin's main() run with --kubeconfig."""

from __future__ import annotations

import io
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from fracgpu import names
from tests.chart.render import RendererUnavailableError, render
from tests.kubectl.objects import assigned_pod
from webhook.kubectl import plugin as kubectl_plugin

pytestmark = pytest.mark.e2e


def _run(kubeconfig: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = kubectl_plugin.main(["--kubeconfig", str(kubeconfig), *args], out=out)
    return code, out.getvalue()


@pytest.fixture
def cluster(kube_client: kubernetes.client.ApiClient, nodes: Any, namespace: str) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:6]
    big, small = f"kc-a100-{suffix}", f"kc-t4-{suffix}"
    nodes.gpu_node(big, gpus=2)
    nodes.gpu_node(small, gpus=1, model="Tesla T4", memory_mib=15360)
    core = kubernetes.client.CoreV1Api(kube_client)
    pods = [
        assigned_pod(namespace, "train", big, {"main": [(0, 50, 8192)]}),
        assigned_pod(namespace, "pair", big, {"a": [(0, 25, 4096)], "b": [(1, 100, 40960)]}),
        assigned_pod(namespace, "t4", small, {"main": [(0, 30, 3072)]}),
    ]
    for pod in pods:
        core.create_namespaced_pod(namespace, pod)
    custom = kubernetes.client.CustomObjectsApi(kube_client)
    quota = {
        "apiVersion": names.API_VERSION,
        "kind": names.GPUQUOTA_KIND,
        "metadata": {"name": "gpu"},
        "spec": {"hard": {"cores": 300, "memoryMiB": 65536}},
    }
    custom.create_namespaced_custom_object(
        names.GROUP, names.CRD_VERSION, namespace, names.GPUQUOTA_PLURAL, quota
    )
    custom.patch_namespaced_custom_object_status(
        names.GROUP,
        names.CRD_VERSION,
        namespace,
        names.GPUQUOTA_PLURAL,
        "gpu",
        {"status": {"used": {"cores": 205, "memoryMiB": 55296, "gpus": 3}}},
    )
    return {"big": big, "small": small, "namespace": namespace}


def test_nodes_table_and_json(kubeconfig: Path, cluster: dict[str, Any]) -> None:
    code, text = _run(kubeconfig, "nodes")
    assert code == 0, text
    ns, big = cluster["namespace"], cluster["big"]
    row = next(line for line in text.splitlines() if line.startswith(big))
    assert "75/100 (75%)" in row and "12288/40960" in row
    assert f"{ns}/train/main 50c/8192MiB" in row and f"{ns}/pair/a 25c/4096MiB" in row
    code, raw = _run(kubeconfig, "-o", "json", "nodes", cluster["small"])
    assert code == 0
    data = json.loads(raw)
    (node,) = data["nodes"]
    assert node["node"] == cluster["small"]
    assert node["gpus"][0]["model"] == "Tesla T4"
    assert node["compute"] == {"allocated": 30, "total": 100}
    assert node["memoryMiB"] == {"allocated": 3072, "total": 15360}


def test_quota(kubeconfig: Path, cluster: dict[str, Any]) -> None:
    code, text = _run(kubeconfig, "quota", "-n", cluster["namespace"])
    assert code == 0, text
    row = text.splitlines()[1].split()
    assert row == [cluster["namespace"], "gpu", "(all)", "205/300", "55296/65536", "3/-"]
    code, raw = _run(kubeconfig, "-o", "yaml", "quota", "-n", cluster["namespace"])
    (quota,) = yaml.safe_load(raw)["quotas"]
    assert quota["used"] == {"cores": 205, "memoryMiB": 55296, "gpus": 3}


def test_pod(kubeconfig: Path, cluster: dict[str, Any]) -> None:
    ns = cluster["namespace"]
    code, text = _run(kubeconfig, "pod", "pair", "-n", ns)
    assert code == 0, text
    assert f"Node:         {cluster['big']}" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line[:2] in ("a ", "b ")}
    assert rows["a"][1] == "0" and rows["a"][-5:-3] == ["25", "4096"]
    assert rows["b"][1] == "1" and rows["b"][-5:-3] == ["100", "40960"]
    # No kubelet or agent runs here: the plugin says why there is no live usage.
    assert "Live usage: not available: no fracgpu agent pod" in text
    code, raw = _run(kubeconfig, "-o", "json", "pod", "t4", "-n", ns, "--no-usage")
    data = json.loads(raw)
    assert data["containers"][0]["devices"][0]["model"] == "Tesla T4"
    assert data["usageNote"] == "not requested (--no-usage)"


def test_errors_are_clear(
    kubeconfig: Path, cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = _run(kubeconfig, "pod", "missing", "-n", cluster["namespace"])
    assert code == 1
    assert f"pod {cluster['namespace']}/missing: not found" in capsys.readouterr().err
    code, _ = _run(kubeconfig, "nodes", "no-such-node")
    assert code == 1
    assert "no-such-node has no GPUNode" in capsys.readouterr().err


def test_a_user_without_rights_is_told_so(
    control_plane: Any, cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # tenant2 has no role at all: reading GPUNodes is forbidden.
    code, _ = _run(control_plane.kubeconfig("tenant2"), "nodes")
    assert code == 1
    assert "forbidden" in capsys.readouterr().err


def test_the_charts_viewer_role_is_enough_for_the_plugin(
    control_plane: Any, kube_client: kubernetes.client.ApiClient, cluster: dict[str, Any]
) -> None:
    """Bind the chart's own <fullname>-viewer ClusterRole to a user who had no rights."""
    try:
        rendered = render()
    except RendererUnavailableError as error:
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(str(error))
    viewer = rendered.one("ClusterRole", "fracgpu-viewer")
    viewer["metadata"]["name"] = f"fracgpu-viewer-{uuid.uuid4().hex[:6]}"
    rbac = kubernetes.client.RbacAuthorizationV1Api(kube_client)
    user = control_plane.identity("tenant2").user
    binding = {
        "metadata": {"name": viewer["metadata"]["name"]},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": viewer["metadata"]["name"],
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    rbac.create_cluster_role(viewer)
    rbac.create_cluster_role_binding(binding)
    try:
        kubeconfig = control_plane.kubeconfig("tenant2")
        deadline = time.monotonic() + 10
        code, text = _run(kubeconfig, "nodes", cluster["big"])
        while code != 0 and time.monotonic() < deadline:  # RBAC informer delay
            time.sleep(0.1)
            code, text = _run(kubeconfig, "nodes", cluster["big"])
        assert code == 0
        assert "75/100 (75%)" in text
        code, _ = _run(kubeconfig, "quota")
        assert code == 0
        code, text = _run(kubeconfig, "pod", "pair", "-n", cluster["namespace"], "--no-usage")
        assert code == 0 and cluster["big"] in text
    finally:
        rbac.delete_cluster_role_binding(viewer["metadata"]["name"])
        rbac.delete_cluster_role(viewer["metadata"]["name"])


def test_pods_in_a_namespace_and_in_all(kubeconfig: Path, cluster: dict[str, Any]) -> None:
    ns = cluster["namespace"]
    code, raw = _run(kubeconfig, "pods", "-n", ns, "-o", "json")
    assert code == 0, raw
    data = json.loads(raw)
    assert sorted(p["name"] for p in data["pods"]) == ["pair", "t4", "train"]
    train = next(p for p in data["pods"] if p["name"] == "train")
    assert train["node"] == cluster["big"]
    assert train["containers"][0]["devices"][0]["cores"] == 50
    code, text = _run(kubeconfig, "-A", "pods")
    assert code == 0, text
    assert text.splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"]
    rows = [line.split() for line in text.splitlines()[1:] if line.startswith(ns)]
    assert sorted(r[1] for r in rows) == ["pair", "t4", "train"]
