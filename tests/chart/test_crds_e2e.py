"""The chart's CRDs on a real kube-apiserver: the example GPUNode and GPUQuota objects are
stored with every field kept (a field the schema did not list would be pruned silently), and
GPUNode overrides outside what the webhook accepts are refused."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from fracgpu import names

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def custom(
    kube_client: kubernetes.client.ApiClient, fracgpu_crds: list[str]
) -> Iterator[kubernetes.client.CustomObjectsApi]:
    yield kubernetes.client.CustomObjectsApi(kube_client)


def _example(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "gpunodes").glob("*.yaml")), ids=lambda p: p.name
)
def test_gpunode_examples_are_stored_whole(
    custom: kubernetes.client.CustomObjectsApi, path: Path
) -> None:
    body = _example(path)
    body["metadata"]["name"] = f"example-{body['metadata']['name']}"
    stored = custom.create_cluster_custom_object(
        names.GROUP, names.CRD_VERSION, names.GPUNODE_PLURAL, body
    )
    try:
        assert stored["spec"] == body["spec"]
    finally:
        custom.delete_cluster_custom_object(
            names.GROUP, names.CRD_VERSION, names.GPUNODE_PLURAL, body["metadata"]["name"]
        )


@pytest.mark.parametrize("path", sorted((EXAMPLES / "quotas").glob("*.yaml")), ids=lambda p: p.name)
def test_gpuquota_examples_are_stored_whole(
    custom: kubernetes.client.CustomObjectsApi, namespace: str, path: Path
) -> None:
    body = _example(path)
    body["metadata"]["namespace"] = namespace
    stored = custom.create_namespaced_custom_object(
        names.GROUP, names.CRD_VERSION, namespace, names.GPUQUOTA_PLURAL, body
    )
    assert stored["spec"] == body["spec"]


@pytest.mark.parametrize(
    ("spec", "accepted"),
    [
        ({"memoryScaling": 1.5, "disableCoreLimit": True}, True),
        ({"memoryScaling": names.MAX_MEMORY_SCALING}, True),
        ({"memoryScaling": 0.5}, False),
        ({"memoryScaling": names.MAX_MEMORY_SCALING + 1}, False),
        ({"disableCoreLimit": "yes"}, False),
    ],
)
def test_gpunode_overrides_in_range_only(
    custom: kubernetes.client.CustomObjectsApi, spec: dict[str, Any], accepted: bool
) -> None:
    name = "crd-range-check"
    body = {
        "apiVersion": names.API_VERSION,
        "kind": names.GPUNODE_KIND,
        "metadata": {"name": name},
        "spec": copy.deepcopy(spec),
    }
    try:
        stored = custom.create_cluster_custom_object(
            names.GROUP, names.CRD_VERSION, names.GPUNODE_PLURAL, body
        )
    except ApiException as error:
        assert not accepted, error.body
        assert error.status == 422
        assert f"spec.{next(iter(spec))}" in str(error.body)
        return
    custom.delete_cluster_custom_object(names.GROUP, names.CRD_VERSION, names.GPUNODE_PLURAL, name)
    assert accepted, f"{spec} was stored"
    assert stored["spec"] == spec
