"""The webhooks' matchConditions evaluated, not only read: which pods and updates a 1.28+
API server would send to fracgpu. The local API server (1.20) has no matchConditions, so
the CEL of files/webhooks.yaml (as the chart fills it: test_render holds the two equal) is
run here by cel-python, an implementation of the same language. A pod the webhook must see
and the condition lets past skips every check fracgpu makes on it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import celpy
import pytest

from fracgpu.dialects import GPU_LOOKALIKES, ResourceNames
from fracgpu.names import AGENT_READ_ANNOTATIONS
from tests.chart import chartfiles
from webhook.admission.shimguard import DEVICE_INJECTION_PREFIXES

TAINT = "fracgpu.io/gpu-node"
Condition = Callable[[Mapping[str, Any], Mapping[str, Any] | None], bool]


def _conditions(taint: str) -> dict[str, Condition]:
    """Hook name -> its one condition as a function of (object, oldObject)."""
    scope = chartfiles.Scope(match_conditions=True, gpu_node_taint=taint)
    mutating, validating = chartfiles.webhook_configurations("https://x", b"P", scope=scope)
    environment = celpy.Environment()
    found: dict[str, Condition] = {}
    for hook in mutating["webhooks"] + validating["webhooks"]:
        (condition,) = hook["matchConditions"]
        program = environment.program(environment.compile(condition["expression"]))

        def run(
            new: Mapping[str, Any], old: Mapping[str, Any] | None, program: Any = program
        ) -> bool:
            activation = {"object": celpy.json_to_cel(dict(new))}
            if old is not None:
                activation["oldObject"] = celpy.json_to_cel(dict(old))
            return bool(program.evaluate(activation))

        found[hook["name"]] = run
    return found


@pytest.fixture(scope="module")
def plain_hooks() -> dict[str, Condition]:
    return _conditions("")


@pytest.fixture(scope="module")
def tainted_hooks() -> dict[str, Condition]:
    return _conditions(TAINT)


def pod(
    resources: Mapping[str, str] | None = None,
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    tolerations: list[dict[str, str]] | None = None,
    node_name: str = "",
    init_resources: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "app"}
    if resources is not None:
        container["resources"] = {"limits": dict(resources)}
    spec: dict[str, Any] = {"containers": [container]}
    if init_resources is not None:
        spec["initContainers"] = [
            {"name": "init", "image": "app", "resources": {"limits": dict(init_resources)}}
        ]
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if node_name:
        spec["nodeName"] = node_name
    metadata: dict[str, Any] = {"name": "p", "namespace": "team"}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if labels is not None:
        metadata["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


CREATE_HOOKS = ("mutate.fracgpu.io", "validate.fracgpu.io")
# Tolerations every pod gets from the DefaultTolerationSeconds plugin before webhooks run.
DEFAULT_TOLERATIONS = [
    {"key": k, "operator": "Exists", "effect": "NoExecute"}
    for k in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
]


def _sent(hooks: Mapping[str, Condition], new: Mapping[str, Any]) -> bool:
    verdicts = {hooks[name](new, None) for name in CREATE_HOOKS}
    assert len(verdicts) == 1, "the mutating and validating create hooks must agree"
    return verdicts.pop()


@pytest.mark.parametrize("resource", sorted(ResourceNames().everything()))
def test_a_pod_asking_any_configured_resource_is_sent(
    plain_hooks: dict[str, Condition], resource: str
) -> None:
    assert _sent(plain_hooks, pod({resource: "1"}))
    assert _sent(plain_hooks, pod({"cpu": "1"}, init_resources={resource: "1"}))


def test_a_pod_without_gpus_or_fracgpu_metadata_is_not_sent(
    plain_hooks: dict[str, Condition], tainted_hooks: dict[str, Condition]
) -> None:
    """The point of matchConditions: a webhook outage does not block ordinary pods, even
    with the GPU-node taint set."""
    ordinary = pod(
        {"cpu": "2", "memory": "1Gi", "example.com/fpga": "1"},
        annotations={"prometheus.io/scrape": "true"},
        labels={"app": "web"},
        tolerations=DEFAULT_TOLERATIONS,
    )
    assert not _sent(plain_hooks, ordinary)
    assert not _sent(tainted_hooks, ordinary)
    assert not _sent(plain_hooks, pod())


@pytest.mark.parametrize(
    "key",
    [
        "tencent.com/vcuda-cores",
        "tencent.com/VCUDA_memory",
        "nvidia.com/gpu-mem",
        "nvidia.com/GPUcores",
        "aliyun.com/gpu-memory",
        "aliyun.com/gpucount",
        "fracgpu.io/cores",
    ],
)
def test_a_pod_asking_a_lookalike_resource_is_sent(
    plain_hooks: dict[str, Condition], key: str
) -> None:
    """The webhook refuses these naming the resource meant; a pod the condition let past
    would be admitted as asking for no GPU and stay Pending for ever."""
    assert ResourceNames().near_miss(key) is not None  # the webhook's own rule
    assert _sent(plain_hooks, pod({key: "1"}))


def test_every_lookalike_domain_is_sent(plain_hooks: dict[str, Condition]) -> None:
    for domain in GPU_LOOKALIKES:
        assert _sent(plain_hooks, pod({f"{domain}/anything-else": "1"})), domain


@pytest.mark.parametrize("prefix", DEVICE_INJECTION_PREFIXES)
def test_a_pod_annotated_to_have_the_runtime_inject_devices_is_sent(
    plain_hooks: dict[str, Condition], prefix: str
) -> None:
    """`cdi.k8s.io/x: nvidia.com/gpu=all` on a pod without GPU resources: every GPU and no
    shim where the node has NVIDIA's CDI spec. The webhook denies it only if it sees it."""
    assert _sent(plain_hooks, pod(annotations={f"{prefix}gpus": "nvidia.com/gpu=all"}))


def test_a_pod_naming_fracgpus_scheduler_is_sent(plain_hooks: dict[str, Condition]) -> None:
    """Only pods fracgpu queued may use it; the webhook refuses any other."""
    naming = pod({"cpu": "1"})
    naming["spec"]["schedulerName"] = chartfiles.default_values()["webhook"]["queue"][
        "schedulerName"
    ]
    assert _sent(plain_hooks, naming)
    naming["spec"]["schedulerName"] = "default-scheduler"
    assert not _sent(plain_hooks, naming)


@pytest.mark.parametrize("where", ["annotations", "labels"])
def test_fracgpu_metadata_on_a_pod_without_gpus_is_sent(
    plain_hooks: dict[str, Condition], where: str
) -> None:
    assert _sent(plain_hooks, pod(**{where: {"fracgpu.io/assignment": "forged"}}))


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": TAINT, "operator": "Exists", "effect": "NoSchedule"},
        {"key": TAINT, "operator": "Equal", "value": "true"},
        {"operator": "Exists"},  # tolerates every taint
        {"key": "", "operator": "Exists", "effect": "NoSchedule"},
    ],
    ids=["key-exists", "key-equal", "everything", "empty-key"],
)
def test_with_the_gpu_node_taint_a_pod_that_could_tolerate_it_is_sent(
    plain_hooks: dict[str, Condition],
    tainted_hooks: dict[str, Condition],
    toleration: dict[str, str],
) -> None:
    """A pod without GPUs tolerating the taint lands on GPU nodes unless the webhook sees
    it; without the taint set there is nothing to hold it to."""
    tolerating = pod(tolerations=[*DEFAULT_TOLERATIONS, toleration])
    assert _sent(tainted_hooks, tolerating)
    assert not _sent(plain_hooks, tolerating)


def test_with_the_gpu_node_taint_a_pod_bound_by_node_name_is_sent(
    plain_hooks: dict[str, Condition], tainted_hooks: dict[str, Condition]
) -> None:
    """kubelet checks no NoSchedule taint for a pod given spec.nodeName."""
    bound = pod({"cpu": "1"}, node_name="gpu-node-1")
    assert _sent(tainted_hooks, bound)
    assert not _sent(plain_hooks, bound)


def _update_sent(hooks: Mapping[str, Condition], old: dict[str, Any], new: dict[str, Any]) -> bool:
    return hooks[chartfiles.UPDATE_HOOK](new, old)


@pytest.mark.parametrize("key", sorted(AGENT_READ_ANNOTATIONS))
def test_an_update_of_an_annotation_the_agent_reads_is_sent(
    plain_hooks: dict[str, Condition], key: str
) -> None:
    before = pod({"cpu": "1"}, annotations={key: "low"})
    assert _update_sent(plain_hooks, pod({"cpu": "1"}), before)  # added
    assert _update_sent(plain_hooks, before, pod({"cpu": "1"}, annotations={key: "high"}))
    assert _update_sent(plain_hooks, before, pod({"cpu": "1"}, annotations={}))  # removed
    assert not _update_sent(plain_hooks, before, before)


@pytest.mark.parametrize("prefix", DEVICE_INJECTION_PREFIXES)
def test_an_update_adding_a_device_injection_annotation_is_sent(
    plain_hooks: dict[str, Condition], prefix: str
) -> None:
    """A container restarted after the update is created with the annotations as they are
    then."""
    before = pod({"cpu": "1"}, annotations={"team": "a"})
    after = pod({"cpu": "1"}, annotations={"team": "a", f"{prefix}x": "nvidia.com/gpu=all"})
    assert _update_sent(plain_hooks, before, after)
    changed = pod({"cpu": "1"}, annotations={"team": "a", f"{prefix}x": "nvidia.com/gpu=0"})
    assert _update_sent(plain_hooks, after, changed)


def test_an_ordinary_update_is_not_sent(
    plain_hooks: dict[str, Condition], tainted_hooks: dict[str, Condition]
) -> None:
    """Finalizer removal, label and owner changes must not wait for the webhook."""
    before = pod({"tencent.com/vcuda-core": "50"}, labels={"app": "a"}, annotations={"x": "1"})
    after = pod({"tencent.com/vcuda-core": "50"}, labels={"app": "b"}, annotations={"x": "2"})
    assert not _update_sent(plain_hooks, before, after)
    assert not _update_sent(tainted_hooks, before, after)


def test_with_the_gpu_node_taint_an_update_adding_a_toleration_is_sent(
    plain_hooks: dict[str, Condition], tainted_hooks: dict[str, Condition]
) -> None:
    before = pod(tolerations=list(DEFAULT_TOLERATIONS))
    after = pod(tolerations=[*DEFAULT_TOLERATIONS, {"key": TAINT, "operator": "Exists"}])
    assert _update_sent(tainted_hooks, before, after)
    assert not _update_sent(plain_hooks, before, after)
