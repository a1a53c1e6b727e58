"""Property tests over HTTPS: random and corrupted reviews never get a 500 or an unsafe patch.

An unsafe patch is one that does not apply, touches anything but fracgpu's fields, drops or
reorders the user's containers, or grants a container more (or other) GPU than it asked.
"""

import copy
import json
from collections.abc import Iterator
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from fracgpu import names
from fracgpu.codec import decode_assignment
from fracgpu.dialects import DialectConfig, parse_container
from fracgpu.errors import FracgpuError
from tests.webhook.conftest import StartWebhook
from tests.webhook.support import A100, CLUSTER, T4, WEBHOOK_SA, Webhook, cluster_state
from webhook.admission.mutate import canonical_resources
from webhook.cli.client import build_review, patch_of

CONFIG = DialectConfig()
BIG_CLUSTER = copy.deepcopy(CLUSTER) | {
    "nodes": [
        {
            "name": f"node-{n}",
            "cpu": "64",
            "memory": "256Gi",
            "gpus": [
                {
                    "uuid": f"GPU-{n}-{i}",
                    "index": i,
                    "model": A100 if n % 2 else T4,
                    "memoryMiB": 40960 if n % 2 else 15360,
                }
                for i in range(4)
            ],
        }
        for n in range(8)
    ]
}
CARD_MIB = {g["uuid"]: g["memoryMiB"] for node in BIG_CLUSTER["nodes"] for g in node["gpus"]}
GPU_NODE = {g["uuid"]: node["name"] for node in BIG_CLUSTER["nodes"] for g in node["gpus"]}
MANAGED = {"team", "limited", "models", "wholes"}

RESOURCE_KEYS = [*sorted(CONFIG.names.all()), "cpu", "memory"]
QUANTITIES = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "2",
            "4",
            "10",
            "30",
            "50",
            "99",
            "100",
            "101",
            "150",
            "200",
            "-1",
            "1.5",
            "500m",
            "1e2",
            "8000",
            "abc",
            "",
            "1Gi",
            "99999999999999999999",
        ]
    ),
    st.integers(-3, 400),
    st.text(max_size=4),
)
VALID_LIMITS = [
    {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"},
    {"tencent.com/vcuda-core": "100"},
    {"tencent.com/vcuda-core": "200", "cpu": "2"},
    {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "20"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"},
    {"aliyun.com/gpu-mem": "2", "memory": "1Gi"},
]
ENV_NAMES = [
    names.ENV_VISIBLE_DEVICES,
    names.ENV_LD_PRELOAD,
    "FRACGPU_MEMORY_LIMIT",
    "FRACGPU_X",
    "PATH",
]
ASSIGNMENT = (
    '{"containers":[{"devices":[{"cores":100,"memoryMiB":40960,"uuid":"GPU-1-0"}],"name":"c0"}],'
    '"node":"node-1","reservationId":"r-x","version":1}'
)
ANNOTATION_KEYS = [
    names.ANNOTATION_ASSIGNMENT,
    names.ANNOTATION_RESERVATION_ID,
    names.ANNOTATION_POLICY,
    names.ANNOTATION_USE_MODELS,
    names.ANNOTATION_AVOID_MODELS,
    names.HAMI_ANNOTATION_USE_GPUTYPE,
    names.HAMI_ANNOTATION_NOUSE_GPUUUID,
    "note",
]
STEERING = {
    names.ANNOTATION_POLICY,
    names.ANNOTATION_USE_MODELS,
    names.ANNOTATION_AVOID_MODELS,
    "note",
}
ANNOTATION_VALUES = [
    "",
    "A100",
    "T4,A100",
    "spread",
    "binpack",
    "bogus",
    "{}",
    "r-x",
    ASSIGNMENT,
    "GPU-1-0",
]
ALLOWED_PREFIXES = ("/metadata/annotations", "/metadata/labels", "/spec/affinity", "/spec/volumes")


@st.composite
def containers(
    draw: st.DrawFn, prefix: str, count: tuple[int, int], hostile: bool
) -> list[dict[str, Any]]:
    """Containers; ``hostile`` ones also set reserved variables and unequal requests."""
    result = []
    for i in range(draw(st.integers(*count))):
        limits = draw(
            st.one_of(
                st.sampled_from(VALID_LIMITS).map(dict),
                st.dictionaries(st.sampled_from(RESOURCE_KEYS), QUANTITIES, max_size=4),
            )
        )
        container: dict[str, Any] = {
            "name": f"{prefix}{i}",
            "image": draw(st.sampled_from(["cuda", "nginx"])),
        }
        modes = ["limits", "both", "random", "none"] if hostile else ["limits", "both", "none"]
        mode = draw(st.sampled_from(modes))
        if mode != "none":
            container["resources"] = {"limits": limits}
        if mode == "both":
            container["resources"]["requests"] = dict(limits)
        if mode == "random":
            container["resources"]["requests"] = draw(
                st.dictionaries(st.sampled_from(RESOURCE_KEYS), QUANTITIES, max_size=2)
            )
        env = draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "name": st.sampled_from(ENV_NAMES),
                        "value": st.sampled_from(["all", "void", "x", "GPU-1-0"]),
                    }
                ),
                max_size=2,
            )
        )
        if env and hostile:
            container["env"] = env
        result.append(container)
    return result


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    hostile = draw(st.booleans())
    annotation_keys = ANNOTATION_KEYS if hostile else [k for k in ANNOTATION_KEYS if k in STEERING]
    label_keys = [names.LABEL_MANAGED, names.LABEL_ASSIGNED_NODE, "app"] if hostile else ["app"]
    meta: dict[str, Any] = {
        "name": "p",
        "namespace": draw(st.sampled_from(sorted(MANAGED | {"skip"}))),
        "annotations": draw(
            st.dictionaries(
                st.sampled_from(annotation_keys), st.sampled_from(ANNOTATION_VALUES), max_size=3
            )
        ),
        "labels": draw(
            st.dictionaries(
                st.sampled_from(label_keys), st.sampled_from(["true", "node-1", "x"]), max_size=2
            )
        ),
    }
    spec: dict[str, Any] = {
        "containers": draw(containers("c", (1, 3), hostile)),
        "volumes": [{"name": "data", "emptyDir": {}}],
    }
    init = draw(containers("i", (0, 1), hostile))
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths(child, (*prefix, index))


def corrupt(document: Any, path: tuple[Any, ...], replacement: Any, delete: bool) -> Any:
    if not path:
        return replacement
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return document


def check_reply(status: int, body: dict[str, Any], review: Any) -> None:
    assert status in (200, 400, 413, 415), (status, body)
    if status != 200:
        assert body["kind"] == "Status" and body["message"]
        return
    response = body["response"]
    assert response["uid"] == review["request"]["uid"]
    assert response.get("status", {}).get("code") != 500, response


def check_patch(ops: list[dict[str, Any]], review: dict[str, Any]) -> None:
    request = review["request"]
    original = request["object"]
    mutated = jsonpatch.apply_patch(original, ops)  # raises if the patch does not apply
    for op in ops:
        for path in (op["path"], op.get("from", op["path"])):
            parts = path.split("/")
            allowed = path.startswith(ALLOWED_PREFIXES) or (
                len(parts) >= 5
                and parts[2] in ("containers", "initContainers")
                and parts[4] in ("env", "resources", "volumeMounts")
            )
            assert allowed, op
    for field in ("containers", "initContainers"):
        before = original["spec"].get(field, [])
        after = mutated["spec"].get(field, [])
        assert [c["name"] for c in before] == [c["name"] for c in after]
        for old, new in zip(before, after, strict=True):
            strip = lambda c: {  # noqa: E731
                k: v for k, v in c.items() if k not in ("env", "resources", "volumeMounts")
            }
            assert strip(old) == strip(new)
            # The tenant's mounts stay; fracgpu adds only the container's own region mount.
            own = names.region_volume_name(new["name"])
            assert [m for m in old.get("volumeMounts") or [] if m.get("name") != own] == [
                m for m in new.get("volumeMounts") or [] if m.get("name") != own
            ]
    region_volumes = {
        names.region_volume_name(c["name"])
        for f in ("containers", "initContainers")
        for c in mutated["spec"].get(f, [])
    }
    for spec in (original["spec"], mutated["spec"]):
        spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] not in region_volumes]
    assert {
        k: v
        for k, v in original["spec"].items()
        if k not in ("affinity", "containers", "initContainers")
    } == {
        k: v
        for k, v in mutated["spec"].items()
        if k not in ("affinity", "containers", "initContainers")
    }
    for kind in ("annotations", "labels"):
        user_before = {
            k: v
            for k, v in (original["metadata"].get(kind) or {}).items()
            if not k.startswith("fracgpu.io/")
        }
        user_after = {
            k: v
            for k, v in (mutated["metadata"].get(kind) or {}).items()
            if not k.startswith("fracgpu.io/")
        }
        assert user_before == user_after
    annotation = (mutated["metadata"].get("annotations") or {}).get(names.ANNOTATION_ASSIGNMENT)
    if annotation is None or request["userInfo"]["username"] == WEBHOOK_SA:
        return
    assignment = decode_assignment(annotation)
    by_name = {
        c["name"]: c for f in ("initContainers", "containers") for c in original["spec"].get(f, [])
    }
    for held in assignment.containers:
        asked = parse_container(by_name[held.container], CONFIG)
        assert asked is not None
        assert len(held.devices) == asked.gpus
        assert len({d.uuid for d in held.devices}) == asked.gpus
        for device in held.devices:
            assert GPU_NODE[device.uuid] == assignment.node
            assert device.cores == asked.cores
            assert device.memory_mib == asked.memory.resolve(CARD_MIB[device.uuid])
        assert held.core_limit == asked.core_limit  # no elastic bound beyond what was asked
        written = next(
            c
            for c in mutated["spec"]["containers"] + mutated["spec"].get("initContainers", [])
            if c["name"] == held.container
        )
        for section in ("limits", "requests"):
            gpu_part = {
                k: v for k, v in written["resources"][section].items() if k in CONFIG.names.all()
            }
            gpu_part.pop(CONFIG.names.vcuda_core_limit, None)
            assert gpu_part == canonical_resources(held, CONFIG)


def asks_for_gpu(pod: dict[str, Any]) -> bool:
    try:
        return any(
            parse_container(c, CONFIG) is not None
            for f in ("initContainers", "containers")
            for c in pod["spec"].get(f, [])
        )
    except FracgpuError:
        return False


@pytest.fixture
async def big(start: StartWebhook) -> Webhook:
    """One webhook per test function: hypothesis runs all its examples against it."""
    return await start(cluster_state(BIG_CLUSTER))


SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(
    pod=pods(),
    operation=st.sampled_from(["CREATE", "CREATE", "UPDATE"]),
    username=st.sampled_from(["alice", "alice", WEBHOOK_SA]),
    dry_run=st.booleans(),
    old=pods(),
)
async def test_random_pods_never_get_a_500_or_an_unsafe_patch(
    big: Webhook,
    *,
    pod: dict[str, Any],
    operation: str,
    username: str,
    dry_run: bool,
    old: dict[str, Any],
) -> None:
    review = build_review(
        pod,
        operation,
        username=username,
        dry_run=dry_run,
        old=old if operation == "UPDATE" else None,
    )  # type: ignore[arg-type]
    for endpoint in ("/mutate", "/validate"):
        reply = await big.client.review(endpoint, review)
        check_reply(reply.status, reply.body, review)
        assert reply.status == 200
    mutated = await big.client.review("/mutate", review)
    ops = patch_of(mutated.body)
    if ops:
        check_patch(ops, review)
    written = jsonpatch.apply_patch(pod, ops)["metadata"].get("annotations") or {}
    event(f"assignment written: {names.ANNOTATION_ASSIGNMENT in written}")
    namespace = pod["metadata"]["namespace"]
    if (
        mutated.allowed
        and operation == "CREATE"
        and username != WEBHOOK_SA
        and namespace in MANAGED
        and asks_for_gpu(pod)
    ):
        patched = jsonpatch.apply_patch(pod, ops)
        assert names.ANNOTATION_ASSIGNMENT in patched["metadata"]["annotations"], (
            "GPU pod admitted without an assignment"
        )


@SETTINGS
@given(pod=pods(), data=st.data())
async def test_corrupted_reviews_never_get_a_500(
    big: Webhook, pod: dict[str, Any], data: st.DataObject
) -> None:
    review: Any = build_review(pod)
    for _ in range(data.draw(st.integers(1, 3))):
        all_paths = list(paths(review))
        path = data.draw(st.sampled_from(all_paths))
        review = corrupt(
            review, path, data.draw(JSON), delete=bool(path) and data.draw(st.booleans())
        )
    body = json.dumps(review).encode()
    for endpoint in ("/mutate", "/validate"):
        reply = await big.client.post_raw(endpoint, body)
        assert reply.status in (200, 400, 413, 415), reply.body
        if reply.status == 200:
            check_reply(reply.status, reply.body, review)
            ops = patch_of(reply.body)
            if ops and isinstance(review["request"].get("object"), dict):
                jsonpatch.apply_patch(review["request"]["object"], ops)


# -- malformed pods: a clear denial, never an internal error ------------------------------------
# A fresh copy each draw: sampled_from hands out the same list and dict objects, so a pod
# given one twice would hold a cycle (and a later example would see an earlier one's edits).
WRONG = st.sampled_from(
    [None, True, 0, -1, 2.5, "", "x", [], {}, [1], ["a"], {"a": 1}, [{}], [None]]
).map(copy.deepcopy)
OPERATORS = st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"])
REQUIRED_AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"
CONTAINER_FIELDS = ["containers", "initContainers", "ephemeralContainers"]
_AFFINITY = ("spec", "affinity", "nodeAffinity", REQUIRED_AFFINITY, "nodeSelectorTerms")
_MAIN = ("spec", "containers", 0)
# Where a malformation goes (a path from the pod): every field admission reads.
MALFORMED_AT: list[tuple[Any, ...]] = [
    ("spec",),
    ("metadata",),
    ("metadata", "annotations"),
    ("metadata", "annotations", names.ANNOTATION_USE_MODELS),
    ("metadata", "labels"),
    ("spec", "nodeSelector"),
    ("spec", "nodeSelector", "topology.kubernetes.io/zone"),
    ("spec", "tolerations"),
    ("spec", "tolerations", 0),
    *(("spec", "tolerations", 0, m) for m in ("key", "operator", "value", "effect")),
    ("spec", "affinity"),
    ("spec", "affinity", "nodeAffinity"),
    _AFFINITY[:-1],
    _AFFINITY,
    (*_AFFINITY, 0),
    (*_AFFINITY, 0, "matchExpressions"),
    (*_AFFINITY, 0, "matchFields"),
    *((*_AFFINITY, 0, "matchExpressions", 0, m) for m in ("key", "operator", "values")),
    (*_AFFINITY, 0, "matchExpressions", 0, "values", 0),
    ("spec", "overhead"),
    ("spec", "overhead", "cpu"),
    ("spec", "nodeName"),
    ("spec", "containers"),
    _MAIN,
    *((*_MAIN, m) for m in ("name", "env", "resources", "restartPolicy")),
    (*_MAIN, "env", 0),
    *((*_MAIN, "env", 0, m) for m in ("name", "value", "valueFrom")),
    (*_MAIN, "resources", "limits"),
    (*_MAIN, "resources", "limits", "tencent.com/vcuda-core"),
    (*_MAIN, "resources", "requests"),
    ("spec", "initContainers"),
    ("spec", "initContainers", 0, "restartPolicy"),
    ("spec", "ephemeralContainers"),
    ("spec", "volumes"),
]


def well_formed_gpu_pod() -> dict[str, Any]:
    """A GPU pod that reads every field admission reads, and is admitted as it is."""
    gpu = {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8", "cpu": "1"}
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "team",
            "annotations": {names.ANNOTATION_USE_MODELS: "A100", "note": "x"},
            "labels": {"app": "x"},
        },
        "spec": {
            "nodeSelector": {"topology.kubernetes.io/zone": "a"},
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {REQUIRED_AFFINITY: {"nodeSelectorTerms": [
                    {"matchExpressions": [zone, {"key": "n", "operator": "DoesNotExist"}]}
                ]}}
            },
            "overhead": {"cpu": "100m"},
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": gpu},
                 "env": [{"name": "X", "value": "1"}]},
                {"name": "side", "image": "x", "resources": {"requests": {"cpu": "1"}}},
            ],
            "initContainers": [{"name": "init", "image": "x", "restartPolicy": "Always"}],
            "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }  # fmt: skip


def _child(parent: Any, step: Any) -> Any:
    if isinstance(parent, dict):
        return parent.get(step)
    if isinstance(parent, list) and isinstance(step, int) and step < len(parent):
        return parent[step]
    return None


@st.composite
def malformed_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed GPU pod with one to three fields of the wrong type or shape, and (or)
    a container named like another."""
    pod = well_formed_gpu_pod()
    duplicated = draw(st.booleans())
    if duplicated:
        source = draw(st.sampled_from(CONTAINER_FIELDS))
        target = draw(st.sampled_from(CONTAINER_FIELDS))
        twin = copy.deepcopy(draw(st.sampled_from(pod["spec"][source])))
        if target == "ephemeralContainers":
            twin.pop("resources", None)
        pod["spec"][target].append(twin)
    for _ in range(draw(st.integers(0 if duplicated else 1, 3))):
        path = draw(st.sampled_from(MALFORMED_AT))
        parent: Any = pod
        for step in path[:-1]:
            parent = _child(parent, step)
        if isinstance(parent, dict) or _child(parent, path[-1]) is not None:
            parent[path[-1]] = draw(OPERATORS | WRONG if path[-1] == "operator" else WRONG)
    return pod


def duplicate_names(pod: Any) -> bool:
    """Whether the pod is still well formed enough to name the same container twice."""
    spec = _child(pod, "spec")
    found = [
        container.get("name")
        for field in CONTAINER_FIELDS
        for container in (_child(spec, field) if isinstance(_child(spec, field), list) else [])
        if isinstance(container, dict) and isinstance(container.get("name"), str)
    ]
    return len(found) != len(set(found))


@pytest.fixture
async def zoned(start: StartWebhook) -> Webhook:
    return await start(cluster_state(CLUSTER, split_count=1000))


@SETTINGS
@given(pod=malformed_pods(), operation=st.sampled_from(["CREATE", "UPDATE"]))
@example(pod=well_formed_gpu_pod(), operation="CREATE")
async def test_malformed_pods_get_a_clear_denial_never_an_internal_error(
    zoned: Webhook, pod: dict[str, Any], operation: str
) -> None:
    old = well_formed_gpu_pod() if operation == "UPDATE" else None
    review = build_review(pod, operation, old=old)  # type: ignore[arg-type]
    for endpoint in ("/mutate", "/validate"):
        reply = await zoned.client.review(endpoint, review)
        check_reply(reply.status, reply.body, review)
        assert reply.status == 200, reply.body
        response = reply.body["response"]
        if not response["allowed"]:
            assert response["status"]["code"] in (400, 403, 409, 422), response
            assert "failed on request" not in response["status"]["message"], response
        if duplicate_names(pod) and (endpoint == "/validate" or operation == "CREATE"):
            assert not response["allowed"], response
    if pod == well_formed_gpu_pod():  # the base is placed: the damage is what is denied
        assert (await zoned.admit(pod)).allowed
