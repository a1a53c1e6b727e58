"""Admission cannot be stalled by one pod: limits on what it reads, denied by name; pods as
large as kube-apiserver accepts answered from a worker process; node matching whose work
does not multiply the pod's requirements by the nodes."""

import asyncio
import copy
import json
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from tests.webhook.conftest import StartWebhook
from tests.webhook.support import WEBHOOK_SA, Webhook, gpu_pod, plain_pod
from webhook import settings
from webhook.admission import ephemeral
from webhook.admission.review import AdmissionRequest, read_request
from webhook.cli.client import build_review
from webhook.rules import nodeaffinity, tolerations
from webhook.rules.podbounds import PodLimits
from webhook.rules.tolerations import Taint
from webhook.serving import server

GPU = {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def container(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox", **extra}


def terms(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": list(terms)}}}


def expressions(count: int, values: int = 1) -> list[dict[str, Any]]:
    return [
        {"key": f"k{i}", "operator": "NotIn", "values": [f"v{j}" for j in range(values)]}
        for i in range(count)
    ]


def with_spec(pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"].update(spec)
    return pod


# setting -> pod with `n` of what it counts (a GPU pod: admission reads all of it)
SHAPES: dict[str, Callable[[int], dict[str, Any]]] = {
    "max_containers": lambda n: gpu_pod(
        GPU,
        extra_containers=[container(f"c{i}") for i in range(n - 2)],
        init_containers=[container("init")],
    ),
    "max_gpu_containers": lambda n: gpu_pod(
        GPU, extra_containers=[container(f"g{i}", resources={"limits": GPU}) for i in range(n - 1)]
    ),
    "max_env_entries": lambda n: gpu_pod(
        GPU,
        env=[{"name": f"A{i}", "value": "x"} for i in range(n - 1)],
        extra_containers=[container("side", env=[{"name": "B", "value": "y"}])],
    ),
    "max_tolerations": lambda n: with_spec(
        gpu_pod(GPU),
        tolerations=[
            {"key": f"k{i}", "operator": "Exists", "effect": "NoSchedule"} for i in range(n)
        ],
    ),
    "max_volumes": lambda n: with_spec(
        gpu_pod(GPU), volumes=[{"name": f"v{i}", "emptyDir": {}} for i in range(n)]
    ),
    "max_node_selector_terms": lambda n: gpu_pod(
        GPU, affinity=terms(*({"matchExpressions": expressions(1)} for _ in range(n)))
    ),
    "max_node_requirements": lambda n: with_spec(
        gpu_pod(GPU, affinity=terms({"matchExpressions": expressions(n - 2)})),
        nodeSelector={"kubernetes.io/os": "linux", "x": "y"},
    ),
    "max_node_requirement_values": lambda n: gpu_pod(
        GPU,
        affinity=terms(
            {"matchExpressions": expressions(1, n - 1)}, {"matchExpressions": expressions(1, 1)}
        ),
    ),
}
LIMIT = 6  # each limit is set this low, so each pod is small


def test_every_limit_has_a_shape() -> None:
    assert set(SHAPES) == {f.name for f in PodLimits.__dataclass_fields__.values()}


def screened(webhook: Webhook) -> int:
    app = webhook.running.runner.app
    assert app is not None
    return app[server.SCREENER].screened


@pytest.mark.parametrize("key", sorted(SHAPES))
async def test_a_pod_over_a_limit_is_denied_naming_it_and_at_the_limit_is_not(
    start: StartWebhook, key: str
) -> None:
    tight = await start(**{key: str(LIMIT)})
    at = await tight.admit(SHAPES[key](LIMIT))
    assert "fracgpu's limit" not in at.message
    over = await tight.client.review("/mutate", build_review(SHAPES[key](LIMIT + 1)))
    assert over.status == 200 and not over.allowed
    assert over.response["status"]["code"] == 403
    flag = key.replace("_", "-")
    assert f"over fracgpu's limit of {LIMIT} (setting {flag})" in over.message, over.message
    validated = await tight.client.review("/validate", build_review(SHAPES[key](LIMIT + 1)))
    if key != "max_gpu_containers":  # counted where a pod is placed: in /mutate
        assert not validated.allowed and f"setting {flag}" in validated.message


async def test_fracgpus_own_accounts_and_other_namespaces_are_held_to_no_limit(
    start: StartWebhook,
) -> None:
    tight = await start(max_tolerations=str(LIMIT))
    pod = SHAPES["max_tolerations"](LIMIT + 1)
    trusted = await tight.client.review("/validate", build_review(pod, username=WEBHOOK_SA))
    assert trusted.allowed
    pod["metadata"]["namespace"] = "skip"  # opted out in the test cluster
    assert (await tight.client.review("/mutate", build_review(pod))).allowed


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        (("containers", "containers"), ".spec.containers[0] and .spec.containers[1]"),
        (("initContainers", "containers"), ".spec.initContainers[0] and .spec.containers[0]"),
        (
            ("containers", "ephemeralContainers"),
            ".spec.containers[0] and .spec.ephemeralContainers[0]",
        ),
    ],
)
@pytest.mark.parametrize("gpu", [True, False])
async def test_duplicate_container_names_are_denied_not_an_internal_error(
    webhook: Webhook, fields: tuple[str, str], where: str, gpu: bool
) -> None:
    pod = gpu_pod(GPU) if gpu else plain_pod()
    pod["spec"]["containers"] = []
    for field in fields:
        pod["spec"].setdefault(field, []).append(
            container("twin", resources={"limits": GPU}) if gpu else container("twin")
        )
    for endpoint in ("/mutate", "/validate"):
        reply = await webhook.client.review(endpoint, build_review(pod))
        assert reply.status == 200 and not reply.allowed, reply.body
        assert reply.response["status"]["code"] == 403
        assert f'container name "twin" is used twice ({where})' in reply.message


def big(shape: str, count: int) -> dict[str, Any]:
    """A GPU pod about as large as kube-apiserver stores (1.5 MB), made of one part."""
    filler = "x" * 40
    if shape == "expressions":
        return gpu_pod(GPU, affinity=terms({"matchExpressions": expressions(count)}))
    if shape == "terms":
        return gpu_pod(
            GPU, affinity=terms(*({"matchExpressions": expressions(1)} for _ in range(count)))
        )
    if shape == "tolerations":
        return SHAPES["max_tolerations"](count)
    if shape == "containers":
        return gpu_pod(GPU, extra_containers=[container(f"c{i}-{filler}") for i in range(count)])
    if shape == "env":
        return gpu_pod(GPU, env=[{"name": f"E{i}", "value": filler} for i in range(count)])
    return SHAPES["max_volumes"](count)


@pytest.mark.parametrize(
    ("shape", "count", "key"),
    [
        ("expressions", 20_000, "max-node-requirements"),
        ("terms", 20_000, "max-node-selector-terms"),
        ("tolerations", 20_000, "max-tolerations"),
        ("containers", 15_000, "max-containers"),
        ("env", 20_000, "max-env-entries"),
        ("volumes", 40_000, "max-volumes"),
    ],
)
async def test_a_pod_as_large_as_the_apiserver_takes_is_screened_and_denied(
    webhook: Webhook, shape: str, count: int, key: str
) -> None:
    body = orjson.dumps(build_review(big(shape, count)))
    assert 1_000_000 < len(body) < 3 * 2**20
    for endpoint in ("/mutate", "/validate"):
        reply = await webhook.client.post_raw(endpoint, body)
        assert reply.status == 200 and not reply.body["response"]["allowed"], reply.body
        assert f"(setting {key})" in reply.body["response"]["status"]["message"]
    assert screened(webhook) == 2  # answered from the worker's reading


async def test_a_large_pod_within_the_limits_is_admitted_after_screening(
    webhook: Webhook,
) -> None:
    pod = gpu_pod(GPU)
    pod["spec"]["containers"][0]["args"] = ["y" * 1000] * 400  # 400 kB in one list
    admitted = await webhook.admit(pod)
    assert admitted.allowed, admitted.message
    assert screened(webhook) == 2  # /mutate and /validate: screened, then parsed and admitted
    assert admitted.pod["metadata"]["annotations"]["fracgpu.io/assignment"]


async def test_a_large_malformed_review_is_refused_by_the_worker(webhook: Webhook) -> None:
    body = b'{"apiVersion": "admission.k8s.io/v1", "x": "' + b"y" * 300_000 + b'"'
    reply = await webhook.client.post_raw("/mutate", body)
    assert reply.status == 400 and "not JSON" in reply.body["message"]
    deep = json.dumps(build_review(gpu_pod(GPU, annotations={"pad": "z" * 300_000}))).replace(
        '"image": "cuda"', '"image": ' + "[" * 100 + "]" * 100
    )
    reply = await webhook.client.post_raw("/mutate", deep.encode())
    assert reply.status == 400 and "nested deeper than 64" in reply.body["message"]
    assert screened(webhook) == 2  # both refused by the worker, neither parsed on the loop


class CountingLabels(dict[str, str]):
    """A node's labels that count every read."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        CountingLabels.reads += 1
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        CountingLabels.reads += 1
        return super().__getitem__(key)

    def items(self) -> Any:
        CountingLabels.reads += len(self)
        return super().items()


@pytest.fixture
def counting() -> Iterator[type[CountingLabels]]:
    CountingLabels.reads = 0
    yield CountingLabels


def test_node_matching_reads_each_label_once_however_many_requirements(
    counting: type[CountingLabels],
) -> None:
    """500 requirements against 400 nodes: reading labels per requirement per node (200,000
    reads) is the quadratic work one pod could demand; the index reads each label once."""
    nodes = {f"n{i}": counting({"zone": f"z{i % 4}", "rank": str(i)}) for i in range(400)}
    requirements = [*expressions(250), {"key": "zone", "operator": "In", "values": ["z1"]}]
    pod = {"spec": {"affinity": terms({"matchExpressions": requirements})}}
    pod["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"] += [
        {"matchExpressions": [{"key": "rank", "operator": "Gt", "values": [str(i)]}]}
        for i in range(250)
    ]
    allowed = nodeaffinity.allowed_nodes(pod, nodes)
    assert allowed == {f"n{i}" for i in range(400) if i % 4 == 1 or i > 0}
    assert counting.reads <= 2 * 400


def test_the_label_index_is_built_once_per_label_snapshot(
    counting: type[CountingLabels],
) -> None:
    nodes = {f"n{i}": counting({"zone": "a"}) for i in range(100)}
    cache = nodeaffinity.NodeIndexCache()
    pod = {"spec": {"nodeSelector": {"zone": "a"}}}
    for _ in range(20):
        assert nodeaffinity.allowed_nodes(pod, nodes, cache) == set(nodes)
    assert counting.reads == 100
    nodes = dict(nodes)  # a new snapshot (a node changed): indexed again
    nodeaffinity.allowed_nodes(pod, nodes, cache)
    assert counting.reads == 200


class CountingTaint(Taint):
    reads = 0

    def __getattribute__(self, name: str) -> Any:
        if name in ("key", "value", "effect"):
            CountingTaint.reads += 1
        return super().__getattribute__(name)


def test_toleration_matching_reads_each_taint_a_few_times_however_many_tolerations() -> None:
    CountingTaint.reads = 0
    taints = {f"n{i}": (CountingTaint(f"t{i % 7}", "NoSchedule", "v"),) for i in range(300)}
    pod = {
        "spec": {
            "tolerations": [
                {"key": f"other{i}", "operator": "Equal", "value": "v"} for i in range(250)
            ]
            + [{"key": "t3", "operator": "Exists", "effect": "NoSchedule"}]
        }
    }
    excluded = tolerations.untolerated_nodes(pod, taints)
    assert excluded == {f"n{i}" for i in range(300) if i % 7 != 3}
    assert CountingTaint.reads <= 10 * 300  # per taint per toleration would be 75,000


@pytest.mark.parametrize("key", sorted(SHAPES))
def test_each_limit_is_validated_at_start_up(key: str) -> None:
    with pytest.raises(settings.SettingsError, match="use a whole number of 1 or more"):
        settings.from_mapping({key: "0"})
    assert getattr(settings.from_mapping({key: "7"}).pod_limits, key) == 7


async def test_large_reviews_are_read_and_screened_a_few_at_a_time(
    start: StartWebhook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most screen_workers large bodies are read and screened at once: the rest wait
    before their bodies are read, so many of them cannot exhaust the webhook's memory."""
    webhook = await start(screen_workers="1")
    app = webhook.running.runner.app
    assert app is not None
    screener = app[server.SCREENER]
    real = screener.screen
    busy = {"now": 0, "most": 0}

    async def counted(body: bytes, content_type: str) -> Any:
        busy["now"] += 1
        busy["most"] = max(busy["most"], busy["now"])
        try:
            return await real(body, content_type)
        finally:
            busy["now"] -= 1

    monkeypatch.setattr(screener, "screen", counted)
    body = orjson.dumps(build_review(big("tolerations", 20_000)))
    replies = await asyncio.gather(*(webhook.client.post_raw("/mutate", body) for _ in range(4)))
    assert all(r.status == 200 and not r.body["response"]["allowed"] for r in replies)
    assert busy["most"] == 1 and screener.screened == 4


class Uncopyable(list[str]):
    """Container args that fail the test if anything copies or compares them."""

    def __deepcopy__(self, memo: Any) -> Any:
        raise AssertionError("the pod's args were copied")

    def __eq__(self, other: object) -> bool:
        raise AssertionError("the pod's args were compared")

    __hash__ = None  # type: ignore[assignment]


def test_a_debug_container_added_to_a_huge_pod_copies_only_what_it_writes() -> None:
    """Mutating pods/ephemeralcontainers once deep-copied and diffed the whole pod (100 ms for
    a 1.9 MB pod); the patch now touches only the added containers' env."""
    old = gpu_pod(GPU)
    old["spec"]["containers"][0]["args"] = Uncopyable(["a"] * 100_000)
    new = dict(old, spec={**old["spec"], "ephemeralContainers": [container("debug")]})
    review = build_review(new, "UPDATE", old=old)
    review["request"]["subResource"] = "ephemeralcontainers"
    request = review_of(review)
    verdict = ephemeral.mutate(request)
    assert list(verdict.patch) == [
        {
            "op": "add",
            "path": "/spec/ephemeralContainers/0/env",
            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        }
    ]


def review_of(review: dict[str, Any]) -> AdmissionRequest:
    """The request of a review built in memory (its objects kept as they are)."""
    return read_request(review)


async def test_a_worker_that_dies_is_replaced_and_its_review_fails_closed(
    webhook: Webhook,
) -> None:
    """A worker killed while the webhook runs (out of memory, say): the review in its hands,
    or the next, is refused with a message (503: the API server's failurePolicy fails it
    closed), never a 500, and the one after is screened by a new worker."""
    body = orjson.dumps(build_review(big("tolerations", 20_000)))
    first = await webhook.client.post_raw("/mutate", body)
    assert first.status == 200
    app = webhook.running.runner.app
    assert app is not None
    (pid,) = app[server.SCREENER].worker_pids()
    os.kill(pid, signal.SIGKILL)
    statuses = []
    for _ in range(3):
        reply = await webhook.client.post_raw("/mutate", body)
        statuses.append(reply.status)
        if reply.status == 503:
            assert "worker screening large reviews died" in reply.body["message"]
    assert 500 not in statuses and statuses[-1] == 200, statuses
    assert app[server.SCREENER].worker_pids() not in ([], [pid])
