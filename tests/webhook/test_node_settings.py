"""Node settings and per-container bounds carried in the assignment: vcuda-core-limit, memory
scaling (HAMi deviceMemoryScaling) and compute limiting (HAMi disablecorelimit), each as a
cluster-wide setting with a per-node override, through /mutate then /validate over HTTPS."""

import copy
import json
from typing import Any

import pytest
import yaml

from fracgpu import names
from tests.webhook.conftest import StartWebhook
from tests.webhook.support import CLUSTER, T4_0, Webhook, cluster_state, gpu_pod
from webhook import settings
from webhook.cli.client import build_review
from webhook.state.clusterfile import ClusterFileError, parse_cluster

CORE, MEM = names.RESOURCE_VCUDA_CORE, names.RESOURCE_VCUDA_MEMORY
ON_T4 = {"nvidia.com/use-gputype": "T4"}


def assignment_of(pod: dict[str, Any]) -> dict[str, Any]:
    payload = json.loads(pod["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT])
    assert isinstance(payload, dict)
    return payload


def with_node(**overrides: Any) -> dict[str, Any]:
    """The test cluster with extra keys on the T4 node (node-t, one 15 GiB GPU)."""
    cluster = copy.deepcopy(CLUSTER)
    node_t = next(n for n in cluster["nodes"] if n["name"] == "node-t")
    node_t.update(overrides)
    return cluster


def t4_pod(name: str, memory_units: int, **extra: str) -> dict[str, Any]:
    """A TKEStack share of the T4 (memory in 256 MiB units)."""
    return gpu_pod({CORE: "10", MEM: str(memory_units), **extra}, name=name, annotations=ON_T4)


# -- vcuda-core-limit -----------------------------------------------------------------------------
async def test_vcuda_core_limit_is_carried_to_the_assignment(webhook: Webhook) -> None:
    admitted = await webhook.admit(
        gpu_pod({CORE: "30", MEM: "8", names.RESOURCE_VCUDA_CORE_LIMIT: "70"})
    )
    assert admitted.allowed, admitted.message
    container = assignment_of(admitted.pod)["containers"][0]
    assert container["coreLimit"] == 70
    assert container["devices"][0]["cores"] == 30  # the guarantee is unchanged


async def test_without_vcuda_core_limit_the_assignment_has_no_bound(webhook: Webhook) -> None:
    admitted = await webhook.admit(gpu_pod({CORE: "30", MEM: "8"}))
    assert admitted.allowed, admitted.message
    assert "coreLimit" not in assignment_of(admitted.pod)["containers"][0]


# -- memory scaling -------------------------------------------------------------------------------
async def test_without_scaling_a_gpu_holds_only_its_physical_memory(start: StartWebhook) -> None:
    hook = await start()
    first = await hook.admit(t4_pod("a", 40))  # 10 GiB of the T4's 15 GiB
    assert first.allowed, first.message
    second = await hook.admit(t4_pod("b", 40))
    assert not second.allowed
    assert "memoryScaling" not in assignment_of(first.pod)


async def test_a_node_scaling_factor_offers_more_memory_than_physical(
    start: StartWebhook,
) -> None:
    hook = await start(cluster_state(with_node(memoryScaling=2)))
    placed = [await hook.admit(t4_pod(f"p{i}", 40)) for i in range(4)]
    assert [p.allowed for p in placed] == [True, True, True, False]  # 30 GiB offered, 10 each
    for admitted in placed[:3]:
        payload = assignment_of(admitted.pod)
        assert payload["memoryScaling"] == 2.0
        assert payload["containers"][0]["devices"][0]["uuid"] == T4_0
    assert "15360 MiB" not in placed[3].message


async def test_the_cluster_default_scaling_applies_where_a_node_sets_none(
    start: StartWebhook,
) -> None:
    # The state takes the cluster default from the same settings (webhook.cli.main builds both).
    hook = await start(cluster_state(memory_scaling=1.5), memory_scaling="1.5")
    first, second = await hook.admit(t4_pod("a", 48)), await hook.admit(t4_pod("b", 48))
    assert first.allowed and not second.allowed  # 15 GiB x 1.5 = 22.5 GiB: 12 GiB + 12 GiB no
    assert (await hook.admit(t4_pod("c", 40))).allowed  # but 12 GiB + 10 GiB does
    assert assignment_of(first.pod)["memoryScaling"] == 1.5


async def test_a_node_override_wins_over_the_cluster_default(start: StartWebhook) -> None:
    hook = await start(
        cluster_state(with_node(memoryScaling=1), memory_scaling=3), memory_scaling="3"
    )
    first, second = await hook.admit(t4_pod("a", 40)), await hook.admit(t4_pod("b", 40))
    assert first.allowed and not second.allowed
    assert "memoryScaling" not in assignment_of(first.pod)


# -- compute limiting -----------------------------------------------------------------------------
async def test_disable_core_limit_is_written_into_the_assignment(start: StartWebhook) -> None:
    hook = await start(disable_core_limit="true")
    admitted = await hook.admit(gpu_pod({CORE: "30", MEM: "8"}))
    assert admitted.allowed, admitted.message
    assert assignment_of(admitted.pod)["computeLimit"] is False


async def test_a_node_may_keep_compute_limits_when_the_cluster_disables_them(
    start: StartWebhook,
) -> None:
    hook = await start(cluster_state(with_node(disableCoreLimit=False)), disable_core_limit="true")
    on_t4 = await hook.admit(t4_pod("a", 8))
    assert on_t4.allowed, on_t4.message
    assert "computeLimit" not in assignment_of(on_t4.pod)


async def test_a_node_may_disable_compute_limits_on_its_own(start: StartWebhook) -> None:
    hook = await start(cluster_state(with_node(disableCoreLimit=True)))
    on_t4 = await hook.admit(t4_pod("a", 8))
    assert assignment_of(on_t4.pod)["computeLimit"] is False
    elsewhere = await hook.admit(gpu_pod({CORE: "30", MEM: "8"}, name="b"))
    assert assignment_of(elsewhere.pod)["containers"][0]["devices"][0]["uuid"] != T4_0
    assert "computeLimit" not in assignment_of(elsewhere.pod)


# -- the settings cannot be forged ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("forge", "message"),
    [
        (lambda a: a.update(computeLimit=False), "computeLimit false is not node"),
        (lambda a: a.update(memoryScaling=8), "memoryScaling 8 is not node"),
    ],
    ids=["compute-limit", "memory-scaling"],
)
async def test_validate_denies_forged_settings(webhook: Webhook, forge: Any, message: str) -> None:
    admitted = await webhook.admit(
        gpu_pod({CORE: "30", MEM: "8", names.RESOURCE_VCUDA_CORE_LIMIT: "70"})
    )
    assert admitted.allowed, admitted.message
    forged = copy.deepcopy(admitted.pod)
    payload = assignment_of(forged)
    forge(payload)
    forged["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT] = json.dumps(payload)
    reply = await webhook.client.review("/validate", build_review(forged))
    assert not reply.allowed
    assert message in reply.message
    assert "which only fracgpu may set" in reply.message


# -- bad values -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"memoryScaling": 0.5}, "memoryScaling=0.5 is out of range: use 1 to 16"),
        ({"memoryScaling": 17}, "memoryScaling=17 is out of range: use 1 to 16"),
        ({"memoryScaling": "2"}, "memoryScaling must be a number, not str"),
        ({"disableCoreLimit": "yes"}, "disableCoreLimit: use true or false"),
    ],
)
def test_bad_node_settings_in_the_cluster_file_are_refused(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ClusterFileError) as info:
        parse_cluster(yaml.safe_dump(with_node(**overrides)))
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("memory_scaling", "0.9", "use a factor from 1 to 16"),
        ("memory_scaling", "many", "not a number"),
        ("disable_core_limit", "maybe", "use true or false"),
    ],
)
def test_bad_cluster_defaults_are_refused(key: str, value: str, message: str) -> None:
    with pytest.raises(settings.SettingsError) as info:
        settings.from_mapping({key: value})
    assert f"FRACGPU_{key.upper()}={value!r} is not allowed" in str(info.value)
    assert message in str(info.value)


# -- TKEStack's annotation, HAMi's priority limit: recorded, and removed from the container -------
async def test_the_pod_annotation_vcuda_core_limit_is_recorded(webhook: Webhook) -> None:
    pod = gpu_pod({CORE: "30", MEM: "8"}, annotations={names.RESOURCE_VCUDA_CORE_LIMIT: "80"})
    admitted = await webhook.admit(pod)
    assert admitted.allowed, admitted.message
    assert assignment_of(admitted.pod)["containers"][0]["coreLimit"] == 80


async def test_resources_no_node_offers_are_removed_from_the_container(webhook: Webhook) -> None:
    pod = gpu_pod(
        {
            "nvidia.com/gpu": "1",
            "nvidia.com/gpumem": "2048",
            "nvidia.com/gpucores": "20",
            names.RESOURCE_HAMI_PRIORITY: "0",
        },
        namespace="granted",  # high priority needs an administrator's grant
    )
    admitted = await webhook.admit(pod)
    assert admitted.allowed, admitted.message
    container = assignment_of(admitted.pod)["containers"][0]
    assert container["priority"] == "high"
    resources = admitted.pod["spec"]["containers"][0]["resources"]
    for section in ("limits", "requests"):
        assert set(resources[section]) == {CORE, MEM}  # only what the device plugin offers
    tk = await webhook.admit(
        gpu_pod({CORE: "30", MEM: "8", names.RESOURCE_VCUDA_CORE_LIMIT: "50"}, name="tk")
    )
    assert set(tk.pod["spec"]["containers"][0]["resources"]["limits"]) == {CORE, MEM}


async def test_two_containers_of_one_pod_keep_their_own_priorities(webhook: Webhook) -> None:
    share = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048", "nvidia.com/gpucores": "10"}
    second = {
        "name": "low",
        "image": "cuda",
        "resources": {"limits": {**share, names.RESOURCE_HAMI_PRIORITY: "1"}},
    }
    pod = gpu_pod(
        {**share, names.RESOURCE_HAMI_PRIORITY: "0"},
        extra_containers=[second],
        namespace="granted",  # high priority needs an administrator's grant
    )
    admitted = await webhook.admit(pod)
    assert admitted.allowed, admitted.message
    priorities = {c["name"]: c["priority"] for c in assignment_of(admitted.pod)["containers"]}
    assert priorities == {"main": "high", "low": "low"}
