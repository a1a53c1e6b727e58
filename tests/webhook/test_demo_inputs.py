"""`fracgpu demo --pods DIR`: a directory that is not there says so, and the demo takes every
manifest kind `fracgpu admit` takes, naming them when it refuses a file."""

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook import documents, workloads
from webhook.cli import demo

CLUSTER = demo.EXAMPLES / "cluster.yaml"
GPU_SPEC = {
    "containers": [
        {
            "name": "c",
            "image": "cuda",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "10"}},
        }
    ]
}


def workload(version: str, kind: str) -> dict[str, Any]:
    """A manifest of ``kind`` whose pod template asks for a share of one GPU."""
    template: dict[str, Any] = {"metadata": {"labels": {"app": "w"}}, "spec": GPU_SPEC}
    keys = workloads.TEMPLATES[(version, kind)]
    body: dict[str, Any] = template
    for key in reversed(keys):
        body = {key: body}
    return {
        "apiVersion": version,
        "kind": kind,
        "metadata": {"name": "w", "namespace": "team"},
        **body,
    }


async def test_a_pods_directory_that_does_not_exist_says_so(tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    with pytest.raises(documents.DocumentError) as raised:
        await demo.run(CLUSTER, absent, io.StringIO())
    message = str(raised.value)
    assert message.startswith(f"pod directory {absent} does not exist: pass --pods"), message
    assert workloads.KINDS_TAKEN in message
    a_file = tmp_path / "pod.yaml"
    a_file.write_text("{}\n")
    with pytest.raises(documents.DocumentError, match="is not a directory"):
        await demo.run(CLUSTER, a_file, io.StringIO())


async def test_an_empty_directory_says_what_it_should_hold(tmp_path: Path) -> None:
    out = io.StringIO()
    assert await demo.run(CLUSTER, tmp_path, out) == 1
    assert out.getvalue() == (
        f"no manifests (*.yaml) in {tmp_path}: put Pod manifests, or workloads' with a pod "
        f"template ({workloads.KINDS_TAKEN}) there\n"
    )


@pytest.mark.parametrize(("version", "kind"), sorted(workloads.TEMPLATES))
def test_the_demo_takes_every_kind_admit_takes(tmp_path: Path, version: str, kind: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(workload(version, kind)))
    pod, _ = workloads.load_manifest(path)
    assert pod == workloads.pod_of(workload(version, kind), str(path))
    assert pod["metadata"]["generateName"] == "w-"


def test_a_file_the_demo_refuses_names_every_kind_it_takes(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\n")
    with pytest.raises(documents.DocumentError) as raised:
        workloads.load_manifest(path)
    assert str(raised.value).endswith(
        f"or a workload with a pod template ({workloads.KINDS_TAKEN})"
    ), raised.value


async def test_a_deployment_goes_through_the_demo_as_its_pod(tmp_path: Path) -> None:
    (tmp_path / "web.yaml").write_text(yaml.safe_dump(workload("apps/v1", "Deployment")))
    out = io.StringIO()
    assert await demo.run(CLUSTER, tmp_path, out) == 0, out.getvalue()
    assert "team/w-*" in out.getvalue()
    assert "1 pods: 1 admitted" in out.getvalue()
