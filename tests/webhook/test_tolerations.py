"""Placement stays off nodes whose NoSchedule/NoExecute taints the pod does not tolerate."""

import copy
from typing import Any

import pytest
import yaml

from fracgpu import names
from tests.webhook.conftest import StartWebhook
from tests.webhook.support import CLUSTER, cluster_state, gpu_pod
from webhook.rules.tolerations import Taint, untolerated_nodes
from webhook.state.clusterfile import ClusterFileError, parse_cluster

NODES = {
    "plain": (),
    "gpu": (Taint("nvidia.com/gpu", "NoSchedule", "present"),),
    "soft": (Taint("team", "PreferNoSchedule", "a"),),
    "draining": (Taint("node.kubernetes.io/unschedulable", "NoExecute"),),
}

CASES = [
    ("none", [], {"plain", "soft"}),
    (
        "Equal with value",
        [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        {"plain", "soft", "gpu"},
    ),
    ("Equal wrong value", [{"key": "nvidia.com/gpu", "value": "absent"}], {"plain", "soft"}),
    ("Exists by key", [{"key": "nvidia.com/gpu", "operator": "Exists"}], {"plain", "soft", "gpu"}),
    (
        "wrong effect",
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}],
        {"plain", "soft"},
    ),
    (
        "Exists without key tolerates all",
        [{"operator": "Exists"}],
        {"plain", "soft", "gpu", "draining"},
    ),
]


@pytest.mark.parametrize(("case", "tolerations", "expected"), CASES, ids=[c[0] for c in CASES])
def test_tolerated_nodes(case: str, tolerations: list[dict[str, Any]], expected: set[str]) -> None:
    pod = {"spec": {"containers": [{"name": "c"}], "tolerations": tolerations}}
    assert set(NODES) - untolerated_nodes(pod, NODES) == expected


def test_untainted_nodes_are_never_excluded_even_for_a_malformed_pod() -> None:
    # no blocking taint anywhere: the pod's tolerations need not even be read
    pod = {"spec": {"tolerations": "not a list"}}
    assert untolerated_nodes(pod, {"a": (), "b": (Taint("x", "PreferNoSchedule"),)}) == set()


SHARE = {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "4"}


def tainted_cluster() -> dict[str, Any]:
    cluster = copy.deepcopy(CLUSTER)
    cluster["nodes"][0]["taints"] = [
        {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
    ]
    return cluster


async def test_placement_avoids_untolerated_taints(start: StartWebhook) -> None:
    hook = await start(cluster_state(tainted_cluster()))
    steer = {"nvidia.com/use-gputype": "A100"}
    denied = await hook.admit(gpu_pod(SHARE, name="a", annotations=steer))
    assert not denied.allowed
    assert denied.message.startswith("no GPU node in the cluster could ever hold this pod")
    assert denied.message.endswith(
        "(its nodeSelector, required node affinity and tolerations allow only node-t; "
        "not tolerated: node-a has taint dedicated=training:NoSchedule)"
    )
    assert (await hook.admit(gpu_pod(SHARE, name="b"))).pod["metadata"]["labels"][
        names.LABEL_ASSIGNED_NODE
    ] == "node-t"
    tolerant = gpu_pod(SHARE, name="c", annotations=steer)
    tolerant["spec"]["tolerations"] = [
        {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}
    ]
    result = await hook.admit(tolerant)
    assert result.allowed, result.message
    assert result.pod["metadata"]["labels"][names.LABEL_ASSIGNED_NODE] == "node-a"


def test_a_bad_taint_in_the_cluster_file_is_named() -> None:
    cluster = tainted_cluster()
    cluster["nodes"][0]["taints"][0]["effect"] = "Never"
    with pytest.raises(
        ClusterFileError,
        match=r"nodes\[0\]\.taints\[0\]\.effect: use NoSchedule, PreferNoSchedule, NoExecute",
    ):
        parse_cluster(yaml.safe_dump(cluster))
