"""What mutation writes into a pod, checked on pods that went through the real HTTPS webhook."""

import copy
from typing import Any

import jsonpatch
import pytest

from fracgpu import names, region_volume
from fracgpu.codec import decode_assignment
from fracgpu.dialects import DialectConfig
from fracgpu.model import Assignment, ContainerAssignment, GPUAllocation
from tests.webhook.conftest import StartWebhook
from tests.webhook.support import A100, CLUSTER, T4, Webhook, cluster_state, gpu_pod
from webhook.admission.mutate import decide
from webhook.cli.client import build_review, patch_of

CORE, MEM, LIMIT = (
    "tencent.com/vcuda-core",
    "tencent.com/vcuda-memory",
    "tencent.com/vcuda-core-limit",
)
CARD_MIB = {A100: 40960, T4: 15360}


def assignment_of(pod: dict[str, Any]) -> Assignment:
    return decode_assignment(pod["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT])


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


# limits -> (GPUs, cores per GPU, memory per GPU as MiB or a fraction of the card, canonical)
DIALECT_CASES = [
    ({CORE: "30", MEM: "16"}, 1, 30, 4096, {CORE: "30", MEM: "16"}),
    ({CORE: "200"}, 2, 100, 1.0, {CORE: "200"}),
    # vcuda-core-limit moves into the assignment: no node offers it as a resource
    ({CORE: "20", MEM: "4", LIMIT: "50"}, 1, 20, 1024, {CORE: "20", MEM: "4"}),
    (
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "20"},
        1,
        20,
        3072,
        {CORE: "20", MEM: "12"},
    ),
    (
        {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "30"},
        2,
        30,
        0.5,
        {CORE: "60"},
    ),
    ({"aliyun.com/gpu-mem": "2"}, 1, 0, 2048, {MEM: "8"}),
    ({"aliyun.com/gpu-mem": "1", "aliyun.com/gpu-count": "2"}, 2, 0, 1024, {MEM: "8"}),
]


@pytest.mark.parametrize(("limits", "gpus", "cores", "memory", "canonical"), DIALECT_CASES)
async def test_every_dialect_becomes_canonical_resources_and_a_matching_assignment(
    webhook: Webhook,
    *,
    limits: dict[str, str],
    gpus: int,
    cores: int,
    memory: float,
    canonical: dict[str, str],
) -> None:
    original = gpu_pod(limits)
    result = await webhook.admit(original)
    assert result.allowed, result.message
    assignment = assignment_of(result.pod)
    (held,) = assignment.containers
    models = webhook.state.models()
    assert len(held.devices) == gpus
    assert len({d.uuid for d in held.devices}) == gpus
    for device in held.devices:
        card = CARD_MIB[models[device.uuid]]
        expected = memory if isinstance(memory, int) else int(card * memory)
        assert (device.cores, device.memory_mib) == (cores, expected)
    container = result.pod["spec"]["containers"][0]
    resources = container["resources"]
    total_blocks = sum(d.memory_mib for d in held.devices) // names.MEMORY_BLOCK_MIB
    assert resources["limits"] == canonical | {MEM: str(total_blocks)}
    assert resources["requests"] == resources["limits"]
    assert held.core_limit == (int(limits[LIMIT]) if LIMIT in limits else None)
    assert env_of(container)[names.ENV_VISIBLE_DEVICES] == ",".join(d.uuid for d in held.devices)
    meta = result.pod["metadata"]
    assert meta["annotations"][names.ANNOTATION_RESERVATION_ID] == assignment.reservation_id
    assert meta["labels"] == {
        names.LABEL_MANAGED: "true",
        names.LABEL_ASSIGNED_NODE: assignment.node,
    }


async def test_the_patch_applied_to_the_original_equals_the_mutated_pod(webhook: Webhook) -> None:
    original = gpu_pod(
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"},
        annotations={"team": "vision"},
        labels={"app": "x"},
        env=[{"name": "PATH", "value": "/bin"}],
        extra_containers=[{"name": "side", "image": "busybox"}],
        init_containers=[{"name": "init", "image": "busybox"}],
    )
    before = copy.deepcopy(original)
    reply = await webhook.client.review("/mutate", build_review(original))
    patched = jsonpatch.apply_patch(original, patch_of(reply.body))
    assert original == before  # apply_patch did not change its input
    expected = decide(original, assignment_of(patched), DialectConfig())
    assert patched == expected
    assert reply.response["patchType"] == "JSONPatch"


async def test_containers_without_gpus_get_void_and_user_env_is_kept(webhook: Webhook) -> None:
    original = gpu_pod(
        {CORE: "10", MEM: "2"},
        env=[{"name": "PATH", "value": "/bin"}, {"name": "HOME", "value": "/root"}],
        extra_containers=[
            {"name": "side", "image": "busybox", "env": [{"name": "A", "value": "1"}]}
        ],
        init_containers=[
            {"name": "init", "image": "busybox"},
            {"name": "gpu-init", "image": "cuda", "resources": {"limits": {CORE: "5", MEM: "1"}}},
        ],
    )
    result = await webhook.admit(original)
    assert result.allowed, result.message
    spec = result.pod["spec"]
    main, side = spec["containers"]
    init, gpu_init = spec["initContainers"]
    assignment = assignment_of(result.pod)
    assert {c.container for c in assignment.containers} == {"main", "gpu-init"}
    assert [e["name"] for e in main["env"]] == ["PATH", "HOME", names.ENV_VISIBLE_DEVICES]
    assert env_of(side) == {"A": "1", names.ENV_VISIBLE_DEVICES: "void"}
    assert env_of(init) == {names.ENV_VISIBLE_DEVICES: "void"}
    gpu_init_held = assignment.for_container("gpu-init")
    assert gpu_init_held is not None
    assert env_of(gpu_init)[names.ENV_VISIBLE_DEVICES] == gpu_init_held.devices[0].uuid


async def test_a_pod_without_gpus_only_gets_void(webhook: Webhook) -> None:
    original = gpu_pod({"cpu": "1"}, extra_containers=[{"name": "b", "image": "x"}])
    reply = await webhook.client.review("/mutate", build_review(original))
    assert reply.allowed
    ops = patch_of(reply.body)
    assert [op["path"] for op in ops] == ["/spec/containers/0/env", "/spec/containers/1/env"]
    assert all(op["value"] == [{"name": names.ENV_VISIBLE_DEVICES, "value": "void"}] for op in ops)
    assert webhook.state.reservations() == ()


PIN = {"key": "metadata.name", "operator": "In"}
OS_LINUX = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}


def required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    terms: list[dict[str, Any]] = affinity["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


@pytest.mark.parametrize(
    ("affinity", "expected_terms"),
    [
        (None, lambda pin: [{"matchFields": [pin]}]),
        (
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [OS_LINUX]},
                            {"matchExpressions": [ZONE]},
                        ]
                    }
                }
            },
            lambda pin: [
                {"matchExpressions": [OS_LINUX], "matchFields": [pin]},
                {"matchExpressions": [ZONE], "matchFields": [pin]},
            ],
        ),
        (
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "NotIn", "values": ["x"]}
                                ]
                            }
                        ]
                    }
                }
            },
            lambda pin: [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "NotIn", "values": ["x"]},
                        pin,
                    ]
                }
            ],
        ),
    ],
    ids=["no-affinity", "two-terms-each-get-the-pin", "existing-match-fields"],
)
async def test_node_pin_is_anded_into_every_required_term(
    webhook: Webhook, affinity: dict[str, Any] | None, expected_terms: Any
) -> None:
    result = await webhook.admit(gpu_pod({CORE: "10", MEM: "2"}, affinity=affinity))
    assert result.allowed, result.message
    pin = PIN | {"values": [assignment_of(result.pod).node]}
    assert required_terms(result.pod) == expected_terms(pin)


async def test_preferred_and_pod_affinity_are_left_alone(webhook: Webhook) -> None:
    preferred = [{"weight": 1, "preference": {"matchExpressions": [ZONE]}}]
    pod_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": []}
    affinity = {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred},
        "podAffinity": pod_affinity,
    }
    result = await webhook.admit(gpu_pod({CORE: "10", MEM: "2"}, affinity=copy.deepcopy(affinity)))
    assert result.allowed, result.message
    written = result.pod["spec"]["affinity"]
    assert written["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert written["podAffinity"] == pod_affinity
    assert len(required_terms(result.pod)) == 1


async def test_a_node_name_too_long_for_a_label_is_only_in_the_annotation(
    start: StartWebhook,
) -> None:
    cluster = copy.deepcopy(CLUSTER)
    long_name = "gpu-" + "x" * 70
    cluster["nodes"] = [cluster["nodes"][1] | {"name": long_name}]
    hook = await start(cluster_state(cluster))
    result = await hook.admit(gpu_pod({CORE: "10", MEM: "2"}))
    assert result.allowed, result.message
    assert assignment_of(result.pod).node == long_name
    assert result.pod["metadata"]["labels"] == {names.LABEL_MANAGED: "true"}


@pytest.mark.parametrize(
    ("annotations", "model"),
    [
        ({"fracgpu.io/use-gpu-models": "T4"}, T4),
        ({"nvidia.com/use-gputype": "t4"}, T4),
        ({"fracgpu.io/avoid-gpu-models": "A100"}, T4),
        ({"nvidia.com/nouse-gputype": "Tesla"}, A100),
        ({"nvidia.com/use-gpuuuid": "GPU-aaaa-0001"}, A100),
        ({"nvidia.com/nouse-gpuuuid": "GPU-aaaa-0000,GPU-aaaa-0001"}, T4),
    ],
)
async def test_model_and_uuid_annotations_steer_placement(
    webhook: Webhook, annotations: dict[str, str], model: str
) -> None:
    result = await webhook.admit(gpu_pod({CORE: "10", MEM: "2"}, annotations=annotations))
    assert result.allowed, result.message
    (device,) = assignment_of(result.pod).containers[0].devices
    assert webhook.state.models()[device.uuid] == model
    if "nvidia.com/use-gpuuuid" in annotations:
        assert device.uuid == "GPU-aaaa-0001"


@pytest.mark.parametrize(("policy", "same_gpu"), [("binpack", True), ("spread", False)])
@pytest.mark.parametrize(
    "key",
    ["fracgpu.io/policy", "hami.io/node-scheduler-policy", "hami.io/gpu-scheduler-policy"],
)
async def test_policy_annotation_chooses_binpack_or_spread(
    webhook: Webhook, key: str, policy: str, same_gpu: bool
) -> None:
    steer = {key: policy, "fracgpu.io/use-gpu-models": "A100"}
    first = await webhook.admit(gpu_pod({CORE: "10", MEM: "2"}, name="one", annotations=steer))
    second = await webhook.admit(gpu_pod({CORE: "10", MEM: "2"}, name="two", annotations=steer))
    assert first.allowed and second.allowed
    uuids = [assignment_of(r.pod).containers[0].devices[0].uuid for r in (first, second)]
    assert (uuids[0] == uuids[1]) is same_gpu


async def test_fracgpus_policy_annotation_wins_over_hamis(webhook: Webhook) -> None:
    steer = {
        "fracgpu.io/policy": "binpack",
        "hami.io/node-scheduler-policy": "spread",
        "fracgpu.io/use-gpu-models": "A100",
    }
    first = await webhook.admit(gpu_pod({CORE: "10", MEM: "2"}, name="one", annotations=steer))
    second = await webhook.admit(gpu_pod({CORE: "10", MEM: "2"}, name="two", annotations=steer))
    uuids = {assignment_of(r.pod).containers[0].devices[0].uuid for r in (first, second)}
    assert len(uuids) == 1


@pytest.mark.parametrize(("count", "gpus"), [("1", 1), ("2", 2)])
async def test_the_default_gpu_count_applies_when_hami_names_no_count(
    start: StartWebhook, count: str, gpus: int
) -> None:
    hook = await start(default_gpu_count=count)
    result = await hook.admit(gpu_pod({"nvidia.com/gpumem": "1024", "nvidia.com/gpucores": "10"}))
    assert result.allowed, result.message
    assert len(assignment_of(result.pod).containers[0].devices) == gpus


async def test_the_default_policy_comes_from_settings(start: StartWebhook) -> None:
    hook = await start(policy="spread")
    steer = {"fracgpu.io/use-gpu-models": "A100"}
    first = await hook.admit(gpu_pod({CORE: "10", MEM: "2"}, name="one", annotations=steer))
    second = await hook.admit(gpu_pod({CORE: "10", MEM: "2"}, name="two", annotations=steer))
    uuids = {assignment_of(r.pod).containers[0].devices[0].uuid for r in (first, second)}
    assert len(uuids) == 2


async def test_renamed_canonical_resources_are_written(start: StartWebhook) -> None:
    hook = await start(
        resource_vcuda_core="example.com/gpu-core", resource_vcuda_memory="example.com/gpu-mem"
    )
    result = await hook.admit(
        gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "20", "nvidia.com/gpumem": "512"})
    )
    assert result.allowed, result.message
    limits = result.pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"example.com/gpu-core": "20", "example.com/gpu-mem": "2"}


def test_decide_leaves_the_pod_alone_and_writes_only_into_its_own_copies() -> None:
    """``decide`` shares what it does not write with the input: the input must stay as it
    was, and the result must equal deciding on a full deep copy."""
    pod = gpu_pod(
        {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"},
        annotations={"team": "ml"},
        labels={"app": "train"},
        env=[{"name": "A", "value": "1"}],
        extra_containers=[{"name": "side", "image": "busybox", "resources": {"limits": {}}}],
        init_containers=[{"name": "init", "image": "busybox"}],
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
    )  # fmt: skip
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    before = copy.deepcopy(pod)
    assignment = Assignment(
        "node-a", "r-1", (ContainerAssignment("main", (GPUAllocation("GPU-aaaa-0000", 30, 2048),)),)
    )
    decided = decide(pod, assignment, DialectConfig())
    assert pod == before
    assert decided == decide(copy.deepcopy(pod), assignment, DialectConfig())
    # The pod's own volumes kept, the GPU container's region volume added after them.
    assert decided["spec"]["volumes"] == [*before["spec"]["volumes"], region_volume.volume("main")]
    assert decided["metadata"]["annotations"]["team"] == "ml"
    assert decided["spec"]["initContainers"][0]["env"][0]["value"] == "void"
