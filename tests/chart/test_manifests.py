"""deploy/manifests/ (install without Helm) is exactly the chart's rendering, and complete."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.chart import manifests
from tests.chart.render_setup import renderer_or_skip


@pytest.fixture(scope="module", autouse=True)
def renderer() -> Path:
    return renderer_or_skip()


def _objects() -> list[dict]:  # type: ignore[type-arg]
    found = []
    for path in sorted(manifests.OUT_DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        found += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return found


def test_manifests_match_the_chart() -> None:
    assert manifests.differences() == [], "run scripts/render-manifests.sh"


def test_a_changed_file_is_reported(tmp_path: Path) -> None:
    manifests.write(tmp_path)
    assert manifests.differences(tmp_path) == []
    service = tmp_path / "webhook-service.yaml"
    service.write_text(service.read_text().replace("port: 443", "port: 444"))
    (tmp_path / "extra.yaml").write_text("kind: ConfigMap\n")
    (tmp_path / "webhook-pdb.yaml").unlink()
    assert manifests.differences(tmp_path) == [
        "webhook-pdb.yaml: missing",
        "extra.yaml: not rendered from the chart",
        "webhook-service.yaml: differs from the chart's rendering",
    ]


def test_manifests_install_without_helm() -> None:
    objects = _objects()
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    # What the Helm hooks do is done by the certificate controller; no hook is left behind.
    assert ("Deployment", "fracgpu-certs") in kinds
    assert not any("helm.sh/hook" in (o["metadata"].get("annotations") or {}) for o in objects)
    assert ("Namespace", manifests.NAMESPACE) in kinds
    for kind in ("Deployment", "DaemonSet", "Service", "ServiceAccount"):
        for obj in (o for o in objects if o["kind"] == kind):
            assert obj["metadata"]["namespace"] == manifests.NAMESPACE
    for obj in objects:
        labels = obj["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/managed-by") in (None, "kubectl"), obj["kind"]
    kustomization = yaml.safe_load((manifests.OUT_DIR / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in manifests.OUT_DIR.glob("*.yaml")} - {"kustomization.yaml"}
