"""The CRD schemas hold the limits the code enforces (checked without an API server here;
tests/chart/test_crds_e2e.py holds a real kube-apiserver to the same files)."""

from __future__ import annotations

from typing import Any

import pytest

from fracgpu import names
from tests.chart import crdschema


def _gpunode(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPUNODE_KIND,
        "metadata": {"name": "gpu-1"},
        "spec": spec,
    }


@pytest.mark.parametrize(
    "spec",
    [
        {"memoryScaling": 1},
        {"memoryScaling": 1.5},
        {"memoryScaling": names.MAX_MEMORY_SCALING},
        {"disableCoreLimit": True},
        {"disableCoreLimit": False, "splitCount": 4, "pool": "inference"},
    ],
)
def test_gpunode_spec_accepts(spec: dict[str, Any]) -> None:
    assert crdschema.problems(_gpunode(**spec)) == []


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"memoryScaling": 0.5}, "spec.memoryScaling"),
        ({"memoryScaling": 0}, "spec.memoryScaling"),
        ({"memoryScaling": names.MAX_MEMORY_SCALING + 0.5}, "spec.memoryScaling"),
        ({"memoryScaling": "2"}, "spec.memoryScaling"),
        ({"disableCoreLimit": "true"}, "spec.disableCoreLimit"),
        ({"memoryscaling": 2}, "spec"),
    ],
)
def test_gpunode_spec_rejects(spec: dict[str, Any], field: str) -> None:
    problems = crdschema.problems(_gpunode(**spec))
    assert any(p.startswith(f"{field}:") for p in problems), problems


def test_gpuquota_schema_rejects_unknown_limits() -> None:
    quota = {
        "apiVersion": names.API_VERSION,
        "kind": names.GPUQUOTA_KIND,
        "metadata": {"name": "q", "namespace": "ns"},
        "spec": {"models": {"A100": {"gpu": 1}}},
    }
    assert crdschema.problems(quota) != []
    quota["spec"] = {"models": {"A100": {"gpus": 1}}, "pools": ["inference"]}
    assert crdschema.problems(quota) == []
