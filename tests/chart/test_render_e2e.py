"""`helm template | kubectl apply --dry-run=server`, without helm: every object the chart
renders is validated by a real kube-apiserver (schemas, defaulting, admission) in dry-run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from tests.chart import chartfiles, manifests
from tests.chart.render import render
from tests.chart.render_setup import renderer_or_skip

pytestmark = pytest.mark.e2e

# Kinds of other projects' CRDs (cert-manager, Prometheus Operator) that this API server
# does not serve; every other rendered object must pass.
FOREIGN_KINDS = frozenset({"Issuer", "Certificate", "PodMonitor", "PrometheusRule"})


@pytest.fixture(scope="module")
def renderer() -> Path:
    return renderer_or_skip()


def _dry_run_all(client: kubernetes.client.ApiClient, objects: list[dict[str, Any]]) -> int:
    dynamic = DynamicClient(client)
    checked = 0
    for obj in objects:
        if obj["kind"] in FOREIGN_KINDS:
            continue
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        namespace = obj["metadata"].get("namespace")
        try:
            resource.create(body=obj, namespace=namespace, dry_run="All")
        except ApiException as error:
            if error.status != 409:  # already there from an earlier profile: fine
                raise AssertionError(
                    f"{obj['kind']} {obj['metadata']['name']}: {error.status} {error.body}"
                ) from None
        checked += 1
    return checked


def _ensure_namespace(client: kubernetes.client.ApiClient, name: str) -> None:
    try:
        kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": name}})
    except ApiException as error:
        if error.status != 409:
            raise


@pytest.mark.parametrize(
    ("profile", "options"),
    [
        ("default", {}),
        ("hami", {"value_files": [chartfiles.CHART_DIR / "values-hami.yaml"]}),
        (
            "everything-on",
            {
                "name": "gpu",
                "namespace": "gpu-platform",
                "values": {
                    "certs": {"mode": "certManager"},
                    "agent": {"privileged": True, "runtimeClassName": "nvidia"},
                    "webhook": {"antiAffinity": "required", "extraTrustedUsers": ["ops"]},
                    "monitoring": {"grafanaDashboard": {"enabled": True}},
                },
            },
        ),
    ],
)
def test_api_server_accepts_every_rendered_object(
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    renderer: Path,
    profile: str,
    options: dict[str, Any],
) -> None:
    result = render(renderer=renderer, **options)
    _ensure_namespace(kube_client, options.get("namespace", "fracgpu-system"))
    objects = result.objects()
    assert _dry_run_all(kube_client, objects) >= len(objects) - 4


def test_dry_run_check_catches_an_invalid_object(
    kube_client: kubernetes.client.ApiClient, renderer: Path
) -> None:
    deployment = render(renderer=renderer).one("Deployment", "fracgpu-webhook")
    deployment["spec"]["replicas"] = -1
    _ensure_namespace(kube_client, "fracgpu-system")
    with pytest.raises(AssertionError, match="replicas"):
        _dry_run_all(kube_client, [deployment])


def test_api_server_accepts_the_plain_manifests(
    kube_client: kubernetes.client.ApiClient, fracgpu_crds: list[str], renderer: Path
) -> None:
    # deploy/manifests/ (install without Helm). They are for 1.21+; this API server is 1.20,
    # which serves PodDisruptionBudget as policy/v1beta1 only: that one object is left out.
    objects = []
    for path in sorted(manifests.OUT_DIR.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    objects = [o for o in objects if o["kind"] != "PodDisruptionBudget"]
    _ensure_namespace(kube_client, manifests.NAMESPACE)
    assert _dry_run_all(kube_client, objects) == len(objects)
