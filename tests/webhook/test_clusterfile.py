"""Cluster-file errors name the file once, then the entry and field, then what is allowed."""

from typing import Any

import pytest
import yaml

from webhook.state.clusterfile import ClusterFileError, parse_cluster

NODE = {"name": "n", "cpu": 4, "memory": "8Gi", "gpus": []}
GPU = {"uuid": "GPU-0", "index": 0, "model": "NVIDIA T4", "memoryMiB": 15360}
POD = {
    "namespace": "a",
    "name": "p",
    "node": "n",
    "containers": [{"name": "c", "devices": [{"uuid": "GPU-0", "cores": 10, "memoryMiB": 256}]}],
}


def error_of(cluster: dict[str, Any]) -> str:
    with pytest.raises(ClusterFileError) as info:
        parse_cluster(yaml.safe_dump(cluster), "c.yaml")
    return str(info.value)


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        (
            {"nodes": [{**NODE, "cpu": "lots"}]},
            "c.yaml: nodes[0].cpu: 'lots' is not a quantity: use a Kubernetes quantity",
        ),
        (
            {"nodes": [NODE, {**NODE, "name": "m", "memory": "-1Gi"}]},
            "c.yaml: nodes[1].memory: -1Gi is negative: use a quantity of 0 or more",
        ),
        (
            {"nodes": [{**NODE, "gpus": [{"uuid": "u"}]}]},
            "c.yaml: nodes[0].gpus[0]: is missing index, memoryMiB, model",
        ),
        (
            {"nodes": [{**NODE, "gpus": [GPU]}], "pods": [{**POD, "cpu": "x" * 500}]},
            "c.yaml: pods[0].cpu: quantity of 500 characters is too long",
        ),
        (
            {
                "nodes": [{**NODE, "gpus": [GPU]}],
                "pods": [
                    {**POD, "containers": [{"name": "c", "devices": [{**GPU, "cores": 500}]}]}
                ],
            },
            "c.yaml: pods[0] containers[0] devices[0]:",
        ),
        (
            {"nodes": [NODE], "quotas": [{"metadata": {"namespace": "a", "name": "q"}}]},
            "c.yaml: quotas[0]: GPUQuota: is missing spec",
        ),
        ({"nodes": "n"}, "c.yaml: nodes: must be a list"),
    ],
)
def test_an_error_names_the_file_once_and_the_entry_and_field(
    cluster: dict[str, Any], message: str
) -> None:
    # Once: "c.yaml: c.yaml nodes[0].gpus[0]: ..." and "c.yaml: 'lots' is not a quantity".
    error = error_of(cluster)
    assert error.startswith(message), error
    assert error.count("c.yaml") == 1, error
    assert len(error) < 400, error
