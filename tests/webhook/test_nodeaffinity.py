"""The pod's own nodeSelector and required node affinity narrow where fracgpu may place it."""

from typing import Any

import pytest

from fracgpu import names
from tests.webhook.support import Webhook, gpu_pod
from webhook.rules.nodeaffinity import allowed_nodes
from webhook.rules.pod import PodShapeError

NODES = {
    "n1": {"zone": "a", "gpu": "a100", "cores": "64"},
    "n2": {"zone": "b", "gpu": "t4", "cores": "16"},
    "n3": {"zone": "b"},
}


def pod_with(spec: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "c"}], **spec}}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


CASES = [
    ("nothing", {}, None),
    (
        "preferred only",
        {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
        None,
    ),
    ("selector", {"nodeSelector": {"zone": "b"}}, {"n2", "n3"}),
    ("selector two keys", {"nodeSelector": {"zone": "b", "gpu": "t4"}}, {"n2"}),
    ("selector none", {"nodeSelector": {"zone": "c"}}, set()),
    ("In", required({"matchExpressions": [expr("gpu", "In", "a100", "h100")]}), {"n1"}),
    (
        "NotIn matches missing",
        required({"matchExpressions": [expr("gpu", "NotIn", "a100")]}),
        {"n2", "n3"},
    ),
    ("Exists", required({"matchExpressions": [expr("gpu", "Exists")]}), {"n1", "n2"}),
    ("DoesNotExist", required({"matchExpressions": [expr("gpu", "DoesNotExist")]}), {"n3"}),
    ("Gt", required({"matchExpressions": [expr("cores", "Gt", "32")]}), {"n1"}),
    ("Lt", required({"matchExpressions": [expr("cores", "Lt", "32")]}), {"n2"}),
    ("Gt not a number", required({"matchExpressions": [expr("zone", "Gt", "1")]}), set()),
    (
        "terms are ORed",
        required(
            {"matchExpressions": [expr("zone", "In", "a")]},
            {"matchExpressions": [expr("gpu", "In", "t4")]},
        ),
        {"n1", "n2"},
    ),
    (
        "expressions are ANDed",
        required({"matchExpressions": [expr("zone", "In", "b"), expr("gpu", "Exists")]}),
        {"n2"},
    ),
    ("matchFields name", required({"matchFields": [expr("metadata.name", "In", "n3")]}), {"n3"}),
    (
        "matchFields NotIn",
        required({"matchFields": [expr("metadata.name", "NotIn", "n3")]}),
        {"n1", "n2"},
    ),
    ("empty term matches nothing", required({}), set()),
    (
        "selector AND affinity",
        {
            "nodeSelector": {"zone": "b"},
            **required({"matchExpressions": [expr("gpu", "DoesNotExist")]}),
        },
        {"n3"},
    ),
]


@pytest.mark.parametrize(("case", "spec", "expected"), CASES, ids=[c[0] for c in CASES])
def test_allowed_nodes(case: str, spec: dict[str, Any], expected: set[str] | None) -> None:
    assert allowed_nodes(pod_with(spec), NODES) == expected


@pytest.mark.parametrize(
    "spec",
    [
        required({"matchExpressions": [{"key": "zone", "operator": "Near"}]}),
        required({"matchExpressions": "zone=a"}),
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": {}}
                }
            }
        },
        {"nodeSelector": ["zone"]},
    ],
)
def test_malformed_affinity_is_a_shape_error(spec: dict[str, Any]) -> None:
    with pytest.raises(PodShapeError):
        allowed_nodes(pod_with(spec), NODES)


SHARE = {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "4"}


async def test_placement_follows_the_node_selector(webhook: Webhook) -> None:
    for zone, node in (("a", "node-a"), ("b", "node-t")):
        pod = gpu_pod(SHARE, name=f"in-{zone}")
        pod["spec"]["nodeSelector"] = {"topology.kubernetes.io/zone": zone}
        result = await webhook.admit(pod)
        assert result.allowed, result.message
        assert result.pod["metadata"]["labels"][names.LABEL_ASSIGNED_NODE] == node


async def test_placement_follows_required_affinity_by_hostname(webhook: Webhook) -> None:
    pod = gpu_pod(
        SHARE,
        affinity=required({"matchExpressions": [expr("kubernetes.io/hostname", "In", "node-a")]})[
            "affinity"
        ],
    )
    result = await webhook.admit(pod)
    assert result.allowed, result.message
    assert result.pod["metadata"]["labels"][names.LABEL_ASSIGNED_NODE] == "node-a"


async def test_no_matching_node_is_denied_with_a_clear_message(webhook: Webhook) -> None:
    pod = gpu_pod(SHARE)
    pod["spec"]["nodeSelector"] = {"topology.kubernetes.io/zone": "mars"}
    result = await webhook.admit(pod)
    assert not result.allowed
    assert result.message == (
        "none of the 2 GPU nodes matches this pod's nodeSelector, required node affinity and "
        "tolerations: fix the selector, add a toleration for the GPU nodes' taints, or label "
        "GPU nodes to match"
    )
    pinned_elsewhere = gpu_pod(SHARE, annotations={"nvidia.com/use-gpuuuid": "GPU-tttt-0000"})
    pinned_elsewhere["spec"]["nodeSelector"] = {"topology.kubernetes.io/zone": "a"}
    result = await webhook.admit(pinned_elsewhere)
    assert not result.allowed
    assert "together with its GPU UUID annotation" in result.message
