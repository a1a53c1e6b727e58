"""Placement stays off nodes whose NoSchedule/NoExecute taints the pod does not tolerate."""

import copy
from typing import Any

import jsonpatch
import pytest
import yaml

from fracgpu import names
from tests.webhook.conftest import StartWebhook
from tests.webhook.support import (
    CLUSTER,
    WEBHOOK_SA,
    cluster_state,
    gpu_pod,
    patch_of,
    plain_pod,
)
from webhook import settings
from webhook.cli.client import build_review
from webhook.rules.tolerations import Taint, untolerated_nodes
from webhook.settings import SettingsError
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


# -- gpu-node-taint: GPU nodes kept for GPU pods (docs/operations.md) --------------------------
GPU_NODE_TAINT = "fracgpu.io/gpu-node"
TOLERATION = {"key": GPU_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}
WHOLE = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}


def gpu_only_cluster() -> dict[str, Any]:
    """Every GPU node tainted, as an operator keeping them for GPU pods does."""
    cluster = copy.deepcopy(CLUSTER)
    for node in cluster["nodes"]:
        node["taints"] = [{"key": GPU_NODE_TAINT, "value": "present", "effect": "NoSchedule"}]
    return cluster


async def test_gpu_pods_get_the_gpu_node_toleration_once_and_are_placed(
    start: StartWebhook,
) -> None:
    without = await start(cluster_state(gpu_only_cluster()))
    refused = await without.admit(gpu_pod(SHARE, name="a"))
    assert not refused.allowed
    assert f"not tolerated: node-a has taint {GPU_NODE_TAINT}=present:NoSchedule" in (
        refused.message
    )

    hook = await start(cluster_state(gpu_only_cluster()), gpu_node_taint=GPU_NODE_TAINT)
    own = {"key": "team", "operator": "Equal", "value": "x", "effect": "NoSchedule"}
    pod = gpu_pod(SHARE, name="b")
    pod["spec"]["tolerations"] = [own]
    placed = await hook.admit(pod)
    assert placed.allowed, placed.message
    assert placed.pod["spec"]["tolerations"] == [own, TOLERATION]
    # reinvoked (another webhook changed the pod): nothing is written twice
    again = await hook.admit(placed.pod)
    assert again.allowed, again.message
    assert again.pod["spec"]["tolerations"] == [own, TOLERATION]

    already = gpu_pod(SHARE, name="c")
    already["spec"]["tolerations"] = [dict(TOLERATION)]
    placed = await hook.admit(already)
    assert placed.allowed, placed.message
    assert placed.pod["spec"]["tolerations"] == [TOLERATION]


async def test_a_queued_gpu_pod_gets_the_gpu_node_toleration_too(start: StartWebhook) -> None:
    hook = await start(
        cluster_state(gpu_only_cluster()), gpu_node_taint=GPU_NODE_TAINT, placement_mode="queue"
    )
    for i in range(3):  # every GPU taken
        assert (await hook.admit(gpu_pod(WHOLE, name=f"fill-{i}"))).allowed
    queued = await hook.admit(gpu_pod(SHARE, name="waits"))
    assert queued.allowed, queued.message
    assert names.ANNOTATION_QUEUED in queued.pod["metadata"]["annotations"]
    assert queued.pod["spec"]["tolerations"] == [TOLERATION]


async def test_validation_refuses_a_gpu_pod_whose_toleration_was_taken_off(
    start: StartWebhook,
) -> None:
    """A later mutating webhook dropping fracgpu's toleration: the pod could never be
    scheduled where fracgpu pinned it."""
    hook = await start(cluster_state(gpu_only_cluster()), gpu_node_taint=GPU_NODE_TAINT)
    mutated = await hook.client.review("/mutate", build_review(gpu_pod(SHARE)))
    assert mutated.allowed, mutated.message
    pod = jsonpatch.apply_patch(gpu_pod(SHARE), patch_of(mutated.body))
    del pod["spec"]["tolerations"]
    validated = await hook.client.review("/validate", build_review(pod))
    assert not validated.allowed
    assert "differs from what fracgpu wrote" in validated.message
    assert "/spec/tolerations" in validated.message


async def test_a_pod_without_gpus_may_not_tolerate_the_gpu_node_taint(
    start: StartWebhook,
) -> None:
    """The attack the taint invites: a tenant's CPU pod tolerating it, to take the CPU and
    memory of GPU nodes that GPU pods and whole-node jobs wait for."""
    hook = await start(cluster_state(gpu_only_cluster()), gpu_node_taint=GPU_NODE_TAINT)
    for tolerations in (
        [dict(TOLERATION)],
        [{"key": GPU_NODE_TAINT, "operator": "Equal", "value": "present"}],
        [{"operator": "Exists"}],  # every taint
    ):
        pod = plain_pod()
        pod["spec"]["tolerations"] = tolerations
        refused = await hook.admit(pod)
        assert not refused.allowed, tolerations
        assert f"tolerates the taint '{GPU_NODE_TAINT}'" in refused.message
        assert "gpu-node-taint" in refused.message
        # the validating webhook refuses it too (a pod that reached it without mutation)
        validated = await hook.client.review("/validate", build_review(pod))
        assert not validated.allowed
    other = plain_pod()
    other["spec"]["tolerations"] = [{"key": "team", "operator": "Exists"}]
    assert (await hook.admit(other)).allowed
    assert (await hook.admit(plain_pod())).allowed
    trusted = plain_pod()
    trusted["spec"]["tolerations"] = [dict(TOLERATION)]  # e.g. fracgpu's own agent
    assert (await hook.admit(trusted, username=WEBHOOK_SA)).allowed
    off = await start(cluster_state(gpu_only_cluster()))
    assert (await off.admit(trusted)).allowed


async def test_a_pod_without_gpus_may_not_name_a_gpu_node(start: StartWebhook) -> None:
    """spec.nodeName skips the scheduler, and kubelet's own admission checks only NoExecute
    taints: without this rule a CPU pod pinned to a GPU node runs there, taint or not."""
    hook = await start(cluster_state(gpu_only_cluster()), gpu_node_taint=GPU_NODE_TAINT)
    pod = plain_pod()
    pod["spec"]["nodeName"] = "node-a"
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "30", "memory": "120Gi"}}
    refused = await hook.admit(pod)
    assert not refused.allowed
    assert "sets spec.nodeName to GPU node 'node-a'" in refused.message
    assert "gpu-node-taint" in refused.message
    # the validating webhook refuses it too (a pod that reached it without mutation)
    validated = await hook.client.review("/validate", build_review(pod))
    assert not validated.allowed
    assert "spec.nodeName" in validated.message
    # a node fracgpu does not manage as a GPU node, and node-a's own kubelet (mirror pods)
    elsewhere = copy.deepcopy(pod)
    elsewhere["spec"]["nodeName"] = "cpu-node-1"
    assert (await hook.admit(elsewhere)).allowed
    assert (await hook.admit(pod, username="system:node:node-a")).allowed
    assert not (await hook.admit(pod, username="system:node:node-t")).allowed
    # a GPU pod naming its node is placed as before, and the rule is off without the setting
    off = await start(cluster_state(gpu_only_cluster()))
    assert (await off.admit(pod)).allowed


async def test_tolerating_the_gpu_node_taint_by_update_is_refused(start: StartWebhook) -> None:
    """Kubernetes lets an update add tolerations (e.g. to a pod held by a scheduling gate):
    the taint rule holds on UPDATE for pods without GPUs."""
    hook = await start(cluster_state(gpu_only_cluster()), gpu_node_taint=GPU_NODE_TAINT)
    gated = plain_pod()
    gated["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    created = await hook.admit(gated)
    assert created.allowed, created.message
    stored = created.pod
    for tolerations in ([dict(TOLERATION)], [{"operator": "Exists"}]):
        updated = copy.deepcopy(stored)
        updated["spec"]["tolerations"] = tolerations
        del updated["spec"]["schedulingGates"]
        reply = await hook.client.review("/validate", build_review(updated, "UPDATE", old=stored))
        assert not reply.allowed, tolerations
        assert f"tolerates the taint '{GPU_NODE_TAINT}'" in reply.message
    # other tolerations and other updates stay allowed
    other = copy.deepcopy(stored)
    other["spec"]["tolerations"] = [{"key": "team", "operator": "Exists"}]
    labelled = copy.deepcopy(stored)
    labelled["metadata"]["labels"] = {"app": "web"}
    for updated in (other, labelled):
        reply = await hook.client.review("/validate", build_review(updated, "UPDATE", old=stored))
        assert reply.allowed, reply.message
    # a pod that tolerated the taint before the setting was made keeps being updatable
    legacy = copy.deepcopy(stored)
    legacy["spec"]["tolerations"] = [dict(TOLERATION)]
    more = copy.deepcopy(legacy)
    more["spec"]["tolerations"].append({"key": "team", "operator": "Exists"})
    reply = await hook.client.review("/validate", build_review(more, "UPDATE", old=legacy))
    assert reply.allowed, reply.message
    # fracgpu's own accounts, and webhooks without the setting, are not held to it
    updated = copy.deepcopy(stored)
    updated["spec"]["tolerations"] = [dict(TOLERATION)]
    trusted = build_review(updated, "UPDATE", old=stored, username=WEBHOOK_SA)
    assert (await hook.client.review("/validate", trusted)).allowed
    off = await start(cluster_state(gpu_only_cluster()))
    plain = build_review(updated, "UPDATE", old=stored)
    assert (await off.client.review("/validate", plain)).allowed


@pytest.mark.parametrize("key", ["/gpu", "gpu/", "Fracgpu.IO/gpu", "a b", "x/" + "y" * 64])
def test_a_bad_gpu_node_taint_is_refused_at_start(key: str) -> None:
    with pytest.raises(
        SettingsError, match=r"FRACGPU_GPU_NODE_TAINT=.* is not allowed: use a taint key such as"
    ):
        settings.from_mapping({"gpu_node_taint": key})
