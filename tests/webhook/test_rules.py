"""Every admission rule and its message, as a table, through /mutate then /validate over HTTPS."""

import copy
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import pytest

from fracgpu import names
from fracgpu.dialects import DialectConfig
from fracgpu.placement import Policy
from tests.webhook.conftest import StartWebhook
from tests.webhook.support import (
    CLUSTER,
    WEBHOOK_SA,
    Webhook,
    cluster_state,
    gpu_pod,
    patch_of,
    plain_pod,
)
from webhook.cli.client import build_review
from webhook.rules import pod as podlib
from webhook.rules.demand import (
    MAX_MODEL_NAME_LENGTH,
    MAX_MODEL_NAMES,
    DemandError,
    PodAsk,
    read_ask,
)

CORE, MEM = "tencent.com/vcuda-core", "tencent.com/vcuda-memory"
SHARE = {CORE: "10", MEM: "4"}


@dataclass(frozen=True)
class Case:
    id: str
    pod: dict[str, Any]
    allowed: bool
    message: str = ""
    username: str = "alice"
    code: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def with_requests(limits: dict[str, str], requests: dict[str, str]) -> dict[str, Any]:
    pod = gpu_pod(limits)
    pod["spec"]["containers"][0]["resources"]["requests"] = requests
    return pod


DIALECT = [
    Case(
        "share-150",
        gpu_pod({CORE: "150"}),
        False,
        'container "main": tencent.com/vcuda-core=150 is not allowed: '
        "use a whole number 1-99 for a share of one GPU, or a multiple of 100",
        code=422,
    ),
    Case("core-0", gpu_pod({CORE: "0"}), False, "tencent.com/vcuda-core=0 is not allowed"),
    Case(
        "memory-0",
        gpu_pod({CORE: "10", MEM: "0"}),
        False,
        "tencent.com/vcuda-memory=0 is not allowed: use a whole number 1-",
    ),
    Case(
        "limit-only",
        gpu_pod({"tencent.com/vcuda-core-limit": "50"}),
        False,
        "set tencent.com/vcuda-core as well",
    ),
    Case(
        "limit-below-share",
        gpu_pod({CORE: "40", "tencent.com/vcuda-core-limit": "30"}),
        False,
        "use a whole number 40-100: at least the guaranteed share",
    ),
    Case(
        "limit-on-whole",
        gpu_pod({CORE: "100", "tencent.com/vcuda-core-limit": "100"}),
        False,
        "remove it: whole GPUs have no upper bound",
    ),
    Case("fraction", gpu_pod({CORE: "1.5"}), False, "vcuda-core=1.5 is not allowed: use a whole"),
    Case("garbage", gpu_pod({CORE: "lots"}), False, "vcuda-core=lots is not allowed: use a whole"),
    Case(
        "request-not-limit",
        with_requests({CORE: "10"}, {CORE: "20"}),
        False,
        "make the request equal the limit 10",
    ),
    Case(
        "request-without-limit",
        with_requests({"cpu": "1"}, {CORE: "20"}),
        False,
        "set it under limits",
    ),
    Case(
        "mixed-dialects",
        gpu_pod({CORE: "10", "nvidia.com/gpu": "1"}),
        False,
        "use one dialect per container",
    ),
    Case(
        "hami-mem-and-percent",
        gpu_pod(
            {
                "nvidia.com/gpu": "1",
                "nvidia.com/gpumem": "100",
                "nvidia.com/gpumem-percentage": "10",
            }
        ),
        False,
        "set either nvidia.com/gpumem (MiB) or nvidia.com/gpumem-percentage, not both",
    ),
    Case(
        "hami-cores-101",
        gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "101"}),
        False,
        "use a whole number 0-100: percent of each GPU's compute",
    ),
    Case(
        "hami-zero-gpus",
        gpu_pod({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "100"}),
        False,
        "use a whole number 1-64 when nvidia.com/gpumem is set",
    ),
    Case("hami-65-gpus", gpu_pod({"nvidia.com/gpu": "65"}), False, "use a whole number 0-64"),
    Case(
        "hami-percent-0",
        gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0"}),
        False,
        "use a whole number 1-100: percent",
    ),
    Case(
        "gpushare-0",
        gpu_pod({"aliyun.com/gpu-mem": "0"}),
        False,
        "use a whole number 1-16384: GiB per GPU",
    ),
    Case("cpu-garbage", gpu_pod({CORE: "10", "cpu": "fast"}), False, "'fast' is not a quantity"),
]

STEERING = [
    Case(
        "bad-policy",
        gpu_pod(SHARE, annotations={"fracgpu.io/policy": "fastest"}),
        False,
        "annotation fracgpu.io/policy='fastest' is not allowed: use one of binpack, spread",
    ),
    Case(
        "bad-policy-hami",
        gpu_pod(SHARE, annotations={"hami.io/node-scheduler-policy": "fragmentation"}),
        False,
        "annotation hami.io/node-scheduler-policy='fragmentation' is not allowed: use one of "
        "binpack, spread",
    ),
    Case(
        "empty-model-list",
        gpu_pod(SHARE, annotations={"fracgpu.io/use-gpu-models": " , "}),
        False,
        "annotation fracgpu.io/use-gpu-models=' , ' is not allowed: use a comma-separated list",
    ),
    Case(
        "bad-priority",
        gpu_pod(SHARE, annotations={"fracgpu.io/priority": "urgent"}),
        False,
        "annotation fracgpu.io/priority='urgent' is not allowed: use high or low",
    ),
    Case(
        "bad-hami-priority",
        gpu_pod(SHARE, annotations={"nvidia.com/priority": "2"}),
        False,
        "annotation nvidia.com/priority='2' is not allowed: use 0 or 1",
    ),
    Case("hami-priority", gpu_pod(SHARE, annotations={"nvidia.com/priority": "1"}), True),
    Case(
        "node-name",
        {**gpu_pod(SHARE), "spec": {**gpu_pod(SHARE)["spec"], "nodeName": "node-a"}},
        False,
        "spec.nodeName='node-a' is not allowed on a GPU pod: it bypasses the scheduler",
    ),
    Case(
        "empty-uuid-list",
        gpu_pod(SHARE, annotations={"nvidia.com/use-gpuuuid": ""}),
        False,
        "GPU UUIDs",
    ),
]

NEVER = [
    Case(
        "model-absent",
        gpu_pod(SHARE, annotations={"nvidia.com/use-gputype": "V100"}),
        False,
        "no GPU node in the cluster could ever hold this pod",
    ),
    Case(
        "memory-too-big",
        gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"}),
        False,
        "no GPU node in the cluster could ever hold this pod "
        '(container "main": 1 GPU x 0 cores + 50176 MiB',
    ),
    Case("too-many-gpus", gpu_pod({CORE: "300"}), False, "could ever hold this pod"),
    Case("cpu-too-big", gpu_pod(SHARE | {"cpu": "64"}), False, "could ever hold this pod"),
]

QUOTA = [
    Case(
        "quota-cores",
        gpu_pod({CORE: "60", MEM: "4"}, namespace="limited"),
        False,
        "GPUQuota limited/small is exceeded: "
        "this pod asks 60 cores, 0 are in use and 50 are allowed",
    ),
    Case(
        "quota-memory",
        gpu_pod({CORE: "30", MEM: "40"}, namespace="limited"),
        False,
        "GPUQuota limited/small is exceeded: "
        "this pod asks 10240 MiB memory, 0 are in use and 8192 are allowed",
    ),
    Case(
        "quota-whole-gpus",
        gpu_pod({CORE: "200"}, namespace="wholes"),
        False,
        "GPUQuota wholes/whole-gpus is exceeded: "
        "this pod asks 2 GPUs (whole or best effort), 0 are in use and 1 are allowed",
    ),
    Case(
        "quota-model",
        gpu_pod(
            {CORE: "30", MEM: "4"},
            namespace="models",
            annotations={"nvidia.com/use-gputype": "A100"},
        ),
        False,
        'GPUQuota models/per-model for GPU model "A100" is exceeded: '
        "this pod asks 30 cores, 0 are in use and 20 are allowed",
    ),
    Case("quota-within", gpu_pod({CORE: "50", MEM: "32"}, namespace="limited"), True),
    Case("quota-other-namespace", gpu_pod({CORE: "60", MEM: "40"}, namespace="team"), True),
]

TAMPER = [
    Case(
        "forged-assignment",
        gpu_pod(SHARE, annotations={names.ANNOTATION_ASSIGNMENT: "{}"}),
        False,
        "this pod sets annotation fracgpu.io/assignment, which only fracgpu may set",
    ),
    Case(
        "forged-reservation",
        gpu_pod(SHARE, annotations={names.ANNOTATION_RESERVATION_ID: "r-1"}),
        False,
        "this pod sets annotation fracgpu.io/reservation-id",
    ),
    Case(
        "unknown-fracgpu-annotation",
        gpu_pod(SHARE, annotations={"fracgpu.io/limits": "x"}),
        False,
        "annotation fracgpu.io/limits",
    ),
    Case(
        "forged-label",
        gpu_pod(SHARE, labels={names.LABEL_ASSIGNED_NODE: "node-a"}),
        False,
        "this pod sets label fracgpu.io/node",
    ),
    Case(
        "visible-devices",
        gpu_pod(SHARE, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
        False,
        'variable NVIDIA_VISIBLE_DEVICES in container "main"',
    ),
    Case(
        "visible-devices-from",
        gpu_pod(
            SHARE,
            env=[
                {
                    "name": "NVIDIA_VISIBLE_DEVICES",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                }
            ],
        ),
        False,
        "variable NVIDIA_VISIBLE_DEVICES",
    ),
    Case(
        "ld-preload",
        gpu_pod(SHARE, env=[{"name": "LD_PRELOAD", "value": "/x.so"}]),
        False,
        "variable LD_PRELOAD",
    ),
    Case(
        "shim-variable",
        gpu_pod(SHARE, env=[{"name": "FRACGPU_REGION", "value": "/tmp"}]),
        False,
        "variable FRACGPU_REGION",
    ),
    Case(
        "init-container-preload",
        gpu_pod(
            SHARE,
            init_containers=[
                {"name": "i", "image": "x", "env": [{"name": "LD_PRELOAD", "value": "a"}]}
            ],
        ),
        False,
        'variable LD_PRELOAD in container "i"',
    ),
    Case(
        "no-gpu-visible-all",
        {
            **plain_pod(),
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "cuda",
                        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                    }
                ]
            },
        },
        False,
        'variable NVIDIA_VISIBLE_DEVICES in container "c"',
    ),
    Case(
        "no-gpu-forged-label",
        {
            **plain_pod(),
            "metadata": {"name": "w", "namespace": "team", "labels": {names.LABEL_MANAGED: "true"}},
        },
        False,
        "label fracgpu.io/assigned",
    ),
    Case(
        "user-may-lower-limits",
        gpu_pod(
            SHARE,
            env=[
                {"name": "FRACGPU_MEMORY_LIMIT", "value": "512m"},
                {"name": "FRACGPU_LOG_LEVEL", "value": "debug"},
            ],
        ),
        True,
    ),
    Case(
        "user-may-steer",
        gpu_pod(
            SHARE,
            annotations={
                "fracgpu.io/policy": "spread",
                "fracgpu.io/priority": "low",
                "fracgpu.io/avoid-gpu-models": "T4",
            },
        ),
        True,
    ),
    Case(
        "no-gpu-void-is-fine",
        {
            **plain_pod(),
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "x",
                        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
                    }
                ]
            },
        },
        True,
    ),
]

TRUSTED_AND_OPTED_OUT = [
    Case(
        "opted-out-namespace",
        gpu_pod({CORE: "150"}, namespace="skip", env=[{"name": "LD_PRELOAD", "value": "x"}]),
        True,
    ),
    Case(
        "service-account-may-set-variables",
        gpu_pod(SHARE, env=[{"name": "FRACGPU_REGION", "value": "/r"}]),
        True,
        username=WEBHOOK_SA,
    ),
]

ALL = DIALECT + STEERING + NEVER + QUOTA + TAMPER + TRUSTED_AND_OPTED_OUT


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
async def test_rule(webhook: Webhook, case: Case) -> None:
    result = await webhook.admit(copy.deepcopy(case.pod), username=case.username)
    assert result.allowed is case.allowed, result.message
    if not case.allowed:
        assert case.message in result.message
        status = (result.validate or result.mutate).response["status"]
        assert status["code"] == (case.code or status["code"])
        assert status["code"] in (403, 409, 422)
        assert webhook.state.reservations() == ()


async def test_no_room_now_names_the_best_candidates(start: StartWebhook) -> None:
    hook = await start()
    for name in ("a", "b", "c"):
        whole = await hook.admit(gpu_pod({CORE: "100"}, name=name))
        assert whole.allowed, whole.message
    result = await hook.admit(gpu_pod({CORE: "100"}, name="d"))
    assert not result.allowed
    assert result.message.startswith(
        'no GPU has room for this pod now (container "main": 1 GPU x 100 cores'
    )
    assert "best candidates:" in result.message
    assert "Controllers such as Deployments and Jobs retry" in result.message


async def test_per_model_quota_moves_the_pod_to_another_model(webhook: Webhook) -> None:
    result = await webhook.admit(gpu_pod({CORE: "30", MEM: "4"}, namespace="models"))
    assert result.allowed, result.message
    assert "node-t" in result.pod["metadata"]["labels"][names.LABEL_ASSIGNED_NODE]


async def test_quota_counts_earlier_admissions(webhook: Webhook) -> None:
    first = await webhook.admit(gpu_pod({CORE: "30", MEM: "4"}, name="a", namespace="limited"))
    assert first.allowed, first.message
    second = await webhook.admit(gpu_pod({CORE: "30", MEM: "4"}, name="b", namespace="limited"))
    assert not second.allowed
    assert "this pod asks 30 cores, 30 are in use and 50 are allowed" in second.message


async def test_quota_counts_pods_already_in_the_cluster_file(start: StartWebhook) -> None:
    cluster = copy.deepcopy(CLUSTER)
    cluster["pods"] = [
        {
            "namespace": "limited",
            "name": "old",
            "node": "node-t",
            "containers": [
                {
                    "name": "c",
                    "devices": [{"uuid": "GPU-tttt-0000", "cores": 45, "memoryMiB": 1024}],
                }
            ],
        }
    ]
    hook = await start(cluster_state(cluster))
    result = await hook.admit(gpu_pod({CORE: "10", MEM: "4"}, namespace="limited"))
    assert "this pod asks 10 cores, 45 are in use and 50 are allowed" in result.message


async def test_a_service_account_may_write_an_assignment_itself(webhook: Webhook) -> None:
    assignment = (
        '{"containers":[{"devices":[{"cores":10,"memoryMiB":1024,"uuid":"GPU-tttt-0000"}],'
        '"name":"main"}],"node":"node-t","reservationId":"r-ctl","version":1}'
    )
    pod = gpu_pod(
        {CORE: "10", MEM: "4"},
        annotations={
            names.ANNOTATION_ASSIGNMENT: assignment,
            names.ANNOTATION_RESERVATION_ID: "r-ctl",
        },
    )
    result = await webhook.admit(pod, username=WEBHOOK_SA)
    assert result.allowed, result.message
    assert webhook.state.reservations() == ()  # not placed again
    assert result.pod["spec"]["containers"][0]["env"] == [
        {"name": names.ENV_VISIBLE_DEVICES, "value": "GPU-tttt-0000"}
    ]
    denied = await webhook.admit(pod, username="alice")
    assert not denied.allowed
    assert "reservation 'r-ctl' is not one fracgpu holds" in denied.message


# -- /validate alone ----------------------------------------------------------------------------
async def test_validate_denies_a_gpu_pod_that_mutation_never_saw(webhook: Webhook) -> None:
    reply = await webhook.client.review("/validate", build_review(gpu_pod(SHARE)))
    assert not reply.allowed
    assert "asks for GPUs but carries no fracgpu assignment" in reply.message


async def test_validate_denies_an_assignment_copied_from_another_pod(webhook: Webhook) -> None:
    admitted = await webhook.admit(gpu_pod(SHARE, name="real"))
    assert admitted.allowed
    copied = copy.deepcopy(admitted.pod)
    copied["metadata"]["name"], copied["metadata"]["namespace"] = "copy", "other"
    reply = await webhook.client.review("/validate", build_review(copied))
    assert not reply.allowed
    assert "the assignment differs from reservation" in reply.message
    assert "which only fracgpu may set" in reply.message


async def test_validate_denies_an_assignment_copied_within_the_namespace(
    webhook: Webhook,
) -> None:
    """The embedded back end has no pod watch to tell that the original is live: the
    reservation is bound to the name it was placed and confirmed under instead."""
    admitted = await webhook.admit(gpu_pod(SHARE, name="real"))
    assert admitted.allowed
    copied = copy.deepcopy(admitted.pod)
    copied["metadata"]["name"] = "copy"
    reply = await webhook.client.review("/validate", build_review(copied))
    assert not reply.allowed
    assert "was made for pod 'real', not for this pod 'copy'" in reply.message
    assert "an assignment copied from another pod" in reply.message
    again = await webhook.client.review("/validate", build_review(admitted.pod))
    assert again.allowed, again.message  # the pod's own retry is not a copy


async def test_a_generate_name_pod_presents_its_reservation_under_any_chosen_name(
    webhook: Webhook,
) -> None:
    """Placed as ``job-*``: validation may see any name the API server chose for it, more
    than one when a 1.31+ API server chooses again after a name collision (validating
    again, not mutating again). A pod of another name presenting it is a copy."""
    pod = gpu_pod(SHARE)
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "job-"
    mutated = await webhook.client.review("/mutate", build_review(pod))
    assert mutated.allowed
    placed = jsonpatch.apply_patch(pod, patch_of(mutated.body))

    def named(name: str) -> dict[str, Any]:
        chosen = copy.deepcopy(placed)
        chosen["metadata"]["name"] = name
        return chosen

    first = await webhook.client.review("/validate", build_review(named("job-x7k2p")))
    assert first.allowed, first.message
    retried = await webhook.client.review("/validate", build_review(named("job-q9d4z")))
    assert retried.allowed, retried.message
    elsewhere = await webhook.client.review("/validate", build_review(named("web-x7k2p")))
    assert not elsewhere.allowed
    assert "was made for pod 'job-*', not for this pod 'web-x7k2p'" in elsewhere.message


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (
            lambda pod: pod["spec"]["containers"][0]["env"][0].update(
                value="GPU-aaaa-0000,GPU-aaaa-0001"
            ),
            "replace /spec/containers/0/env/0/value",
        ),
        (
            lambda pod: [
                pod["spec"]["containers"][0]["resources"][part].update({CORE: "90"})
                for part in ("limits", "requests")
            ],
            "replace /spec/containers/0/resources/limits/tencent.com~1vcuda-core",
        ),
        (lambda pod: pod["spec"].pop("affinity"), "add /spec/affinity"),
    ],
    ids=["visible-devices", "resources", "affinity"],
)
async def test_validate_denies_drift_from_what_fracgpu_wrote(
    webhook: Webhook, change: Any, where: str
) -> None:
    admitted = await webhook.admit(gpu_pod(SHARE))
    assert admitted.allowed
    changed = copy.deepcopy(admitted.pod)
    change(changed)
    reply = await webhook.client.review("/validate", build_review(changed))
    assert not reply.allowed
    assert "differs from what fracgpu wrote for its assignment" in reply.message
    assert where in reply.message


# -- UPDATE -------------------------------------------------------------------------------------
def _update(old: dict[str, Any], change: Any) -> dict[str, Any]:
    new = copy.deepcopy(old)
    change(new)
    return new


UPDATES = [
    (
        "relabel-node",
        lambda p: p["metadata"]["labels"].update({names.LABEL_ASSIGNED_NODE: "elsewhere"}),
        False,
        "this update sets label fracgpu.io/node, which only fracgpu may set",
    ),
    (
        "drop-assignment",
        lambda p: p["metadata"]["annotations"].pop(names.ANNOTATION_ASSIGNMENT),
        False,
        "this update sets annotation fracgpu.io/assignment",
    ),
    (
        "edit-assignment",
        lambda p: p["metadata"]["annotations"].update({names.ANNOTATION_ASSIGNMENT: "{}"}),
        False,
        "annotation fracgpu.io/assignment",
    ),
    (
        "add-fracgpu-annotation",
        lambda p: p["metadata"]["annotations"].update({"fracgpu.io/x": "1"}),
        False,
        "annotation fracgpu.io/x",
    ),
    (
        "debug-container-visible-devices",
        lambda p: p["spec"].update(
            ephemeralContainers=[
                {
                    "name": "dbg",
                    "image": "x",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                }
            ]
        ),
        False,
        'variable NVIDIA_VISIBLE_DEVICES in container "dbg"',
    ),
    ("user-label", lambda p: p["metadata"]["labels"].update({"team": "a"}), True, ""),
    ("image", lambda p: p["spec"]["containers"][0].update(image="cuda:2"), True, ""),
    (
        "steering-annotation",
        lambda p: p["metadata"]["annotations"].update({"fracgpu.io/priority": "low"}),
        True,
        "",
    ),
]


@pytest.mark.parametrize(
    ("case", "change", "allowed", "message"), UPDATES, ids=[u[0] for u in UPDATES]
)
async def test_update(
    webhook: Webhook, case: str, change: Any, allowed: bool, message: str
) -> None:
    admitted = await webhook.admit(gpu_pod(SHARE))
    assert admitted.allowed
    new = _update(admitted.pod, change)
    review = build_review(new, "UPDATE", old=admitted.pod)
    reply = await webhook.client.review("/validate", review)
    assert reply.allowed is allowed, reply.message
    assert message in reply.message
    trusted = await webhook.client.review(
        "/validate", build_review(new, "UPDATE", old=admitted.pod, username=WEBHOOK_SA)
    )
    assert trusted.allowed
    mutated = await webhook.client.review("/mutate", review)
    assert mutated.allowed and "patch" not in mutated.response  # UPDATE is validated only


async def test_update_without_old_object_is_invalid(webhook: Webhook) -> None:
    reply = await webhook.client.review("/validate", build_review(plain_pod(), "UPDATE"))
    assert not reply.allowed
    assert "an UPDATE review must carry oldObject" in reply.message


async def test_node_cpu_and_memory_count_for_fit(webhook: Webhook) -> None:
    big_cpu = gpu_pod(SHARE | {"cpu": "10"}, name="cpu")
    result = await webhook.admit(big_cpu)
    assert result.allowed, result.message
    assert result.pod["metadata"]["labels"][names.LABEL_ASSIGNED_NODE] == "node-a"  # node-t: 8 CPUs
    on_t4 = {"nvidia.com/use-gputype": "T4"}
    fits = await webhook.admit(gpu_pod(SHARE | {"memory": "30Gi"}, name="m1", annotations=on_t4))
    assert fits.allowed, fits.message
    full = await webhook.admit(gpu_pod(SHARE | {"memory": "4Gi"}, name="m2", annotations=on_t4))
    assert not full.allowed
    assert full.message.startswith("no GPU has room for this pod now")


async def test_validate_denies_a_container_injected_after_placement(webhook: Webhook) -> None:
    admitted = await webhook.admit(gpu_pod(SHARE))
    injected = copy.deepcopy(admitted.pod)
    injected["spec"]["containers"].append({"name": "istio-proxy", "image": "proxyv2"})
    reply = await webhook.client.review("/validate", build_review(injected))
    assert not reply.allowed
    assert "add /spec/containers/1/env" in reply.message
    assert "reinvocationPolicy: IfNeeded" in reply.message


def test_a_huge_policy_annotation_is_quoted_only_in_part() -> None:
    """The annotation is the tenant's: a megabyte of it is not echoed into the denial."""
    pod = {
        "metadata": {"name": "p", "annotations": {"fracgpu.io/policy": "x" * (1 << 20)}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {}}}]},
    }
    with pytest.raises(DemandError) as error:
        read_ask(pod, DialectConfig(), Policy.FRAGMENTATION)
    assert "annotation fracgpu.io/policy='xxxx" in str(error.value)
    assert len(str(error.value)) < 300


MODEL_ANNOTATIONS = [
    names.ANNOTATION_USE_MODELS,
    names.ANNOTATION_AVOID_MODELS,
    names.HAMI_ANNOTATION_USE_GPUTYPE,
    names.HAMI_ANNOTATION_NOUSE_GPUTYPE,
]


def _ask(annotations: dict[str, str]) -> PodAsk:
    return read_ask(gpu_pod(SHARE, annotations=annotations), DialectConfig(), Policy.FRAGMENTATION)


@pytest.mark.parametrize("key", MODEL_ANNOTATIONS)
def test_a_model_annotation_holds_at_most_32_names(key: str) -> None:
    """Each pod's model names stay in the learned workload (refused pods' too): a list is
    bounded, and the denial says the bound."""
    most = [f"model-{i}" for i in range(MAX_MODEL_NAMES)]
    ask = _ask({key: ",".join(most)})
    assert ask.demand is not None
    constraints = ask.demand.constraints
    assert len(constraints.include_models + constraints.exclude_models) == MAX_MODEL_NAMES
    with pytest.raises(DemandError) as error:
        _ask({key: ",".join([*most, "one-too-many"])})
    message = str(error.value)
    assert f"annotation {key}='model-0,model-1," in message
    assert f"use a comma-separated list of 1-{MAX_MODEL_NAMES} GPU model names" in message
    assert f"not {MAX_MODEL_NAMES + 1}" in message


@pytest.mark.parametrize("key", MODEL_ANNOTATIONS)
def test_a_model_name_has_at_most_64_characters(key: str) -> None:
    longest = "N" * MAX_MODEL_NAME_LENGTH
    ask = _ask({key: f"T4,{longest}"})
    assert ask.demand is not None
    with pytest.raises(DemandError) as error:
        _ask({key: f"T4,{longest}N"})
    message = str(error.value)
    assert f"a GPU model name has at most {MAX_MODEL_NAME_LENGTH} characters" in message
    assert f"has {MAX_MODEL_NAME_LENGTH + 1}" in message


def test_a_huge_model_annotation_is_refused_and_quoted_only_in_part() -> None:
    """The review's attack: 250 names of 1,000 characters (250 KB) in avoid-gpu-models."""
    huge = ",".join(f"{i:04d}" + "x" * 996 for i in range(250))
    for value in (huge, "y" * 250_000):
        with pytest.raises(DemandError) as error:
            _ask({names.ANNOTATION_AVOID_MODELS: value})
        message = str(error.value)
        assert message.startswith(f"annotation {names.ANNOTATION_AVOID_MODELS}='")
        assert len(message) < 400, len(message)


def test_uuid_annotations_keep_their_own_bound() -> None:
    """UUID lists are not model names: up to 256 of them, and the echo is cut too."""
    uuids = ",".join(f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(256))
    ask = _ask({names.HAMI_ANNOTATION_NOUSE_GPUUUID: uuids})
    assert ask.demand is not None
    assert len(ask.demand.constraints.exclude_uuids) == 256
    with pytest.raises(DemandError) as error:
        _ask({names.HAMI_ANNOTATION_NOUSE_GPUUUID: uuids + ",GPU-extra"})
    assert "use a comma-separated list of 1-256 GPU UUIDs, not 257" in str(error.value)
    assert len(str(error.value)) < 300


@pytest.mark.parametrize(
    ("placed", "presenting", "same"),
    [
        ("web-0", "web-0", True),
        ("web-0", "web-1", False),
        ("job-*", "job-x7k2p", True),
        ("job-*", "job-*", True),  # mutation reinvoked before the name is chosen
        ("job-*", "jobs-x7k2p", False),
        ("job-*", "web-x7k2p", False),
        ("*", "anything", True),  # generateName "" is refused by the API server anyway
        # The API server cuts a generateName past 58 characters before adding its suffix.
        ("a" * 57 + "-29123456-*", "a" * 57 + "-x7k2p", True),
        ("a" * 57 + "-29123456-*", "b" * 57 + "-x7k2p", False),
        ("", "web-0", True),  # a reservation written without the pod's name
    ],
)
def test_same_pod(placed: str, presenting: str, same: bool) -> None:
    assert podlib.same_pod(placed, presenting) is same
