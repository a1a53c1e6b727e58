"""The JSONPatch diffs only what ``decide`` writes, and still turns the pod into the mutated one."""

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracgpu import names
from fracgpu.dialects import DialectConfig
from fracgpu.model import Assignment, ContainerAssignment, GPUAllocation
from webhook.admission.mutate import decide, make_patch, patch_for

CONFIG = DialectConfig()


def assignment(*containers: str) -> Assignment:
    return Assignment(
        "node-a",
        "r-1",
        tuple(
            ContainerAssignment(name, (GPUAllocation(f"GPU-{i}", 10, 1024),))
            for i, name in enumerate(containers)
        ),
    )


def container(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "cuda:12", "imagePullPolicy": "IfNotPresent", **extra}


def twin_env() -> list[dict[str, str]]:
    return [{"name": "A", "value": "1"}]


CASES: list[tuple[str, dict[str, Any], Assignment | None]] = [
    (
        "null metadata members, two identical containers but for the name",
        {
            "metadata": {"name": "p", "annotations": None, "labels": None},
            "spec": {
                "containers": [container("a", env=twin_env()), container("b", env=twin_env())]
            },
        },
        assignment("a"),
    ),
    (
        "no metadata and no spec.affinity, init container, duplicate reserved variables",
        {
            "spec": {
                "initContainers": [container("init")],
                "containers": [
                    container(
                        "main",
                        env=[
                            {"name": names.ENV_VISIBLE_DEVICES, "value": "all"},
                            {"name": "X", "value": "y"},
                            {"name": names.ENV_VISIBLE_DEVICES, "value": "0"},
                        ],
                    )
                ],
            }
        },
        assignment("main"),
    ),
    (
        "two required affinity terms and user labels",
        {
            "metadata": {"name": "p", "labels": {"app": "x"}, "annotations": {"a": "b"}},
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "k", "operator": "Exists"}]},
                                {"matchExpressions": [{"key": "j", "operator": "Exists"}]},
                            ]
                        }
                    }
                },
                "containers": [container("main"), container("side")],
            },
        },
        assignment("main"),
    ),
    ("a pod without GPUs", {"spec": {"containers": [container("main")]}}, None),
]


@pytest.mark.parametrize(
    ("pod", "placed"), [(p, a) for _, p, a in CASES], ids=[c[0] for c in CASES]
)
def test_patch_turns_the_pod_into_the_mutated_one_touching_only_written_parts(
    pod: dict[str, Any], placed: Assignment | None
) -> None:
    before = copy.deepcopy(pod)
    mutated = decide(pod, placed, CONFIG)
    ops = make_patch(pod, mutated)
    assert pod == before  # neither decide nor the diff changes the original
    # The shortcut admission takes: the same operations (in another order, on other paths).
    assert sorted(patch_for(pod, placed, CONFIG), key=str) == sorted(ops, key=str)
    assert jsonpatch.apply_patch(pod, ops) == mutated
    for op in ops:
        parts = op["path"].split("/")[1:]
        whole = parts in (["metadata"], ["spec"])  # added when the pod had none
        member = parts[:2] in (["metadata", "annotations"], ["metadata", "labels"])
        in_container = (
            len(parts) >= 4
            and parts[1] in ("containers", "initContainers")
            and parts[3] in ("env", "resources", "volumeMounts")
        )
        spec_member = parts[:2] in (["spec", "affinity"], ["spec", "volumes"])
        assert whole or member or spec_member or in_container, op
    assert make_patch(mutated, decide(mutated, placed, CONFIG)) == []  # a fixed point


def test_the_copy_is_deep() -> None:
    pod = {"spec": {"containers": [container("main", env=[{"name": "A", "value": "1"}])]}}
    mutated = decide(pod, assignment("main"), CONFIG)
    mutated["spec"]["containers"][0]["env"][0]["value"] = "changed"
    assert pod["spec"]["containers"][0]["env"][0]["value"] == "1"


ENV_NAMES = st.sampled_from([names.ENV_VISIBLE_DEVICES, "A", "B"])
ENV = st.lists(st.fixed_dictionaries({"name": ENV_NAMES, "value": st.sampled_from(["", "0", "x"])}))


@settings(max_examples=200, deadline=None)
@given(
    envs=st.lists(st.one_of(st.none(), ENV), min_size=1, max_size=4),
    placed=st.booleans(),
    other=st.dictionaries(st.sampled_from(["image", "command", "ports"]), st.just("v")),
)
def test_patch_applies_for_random_env_lists(
    envs: list[list[dict[str, str]] | None], placed: bool, other: dict[str, str]
) -> None:
    containers = [
        {"name": f"c{i}", **other, **({} if env is None else {"env": env})}
        for i, env in enumerate(envs)
    ]
    pod = {"metadata": {"name": "p"}, "spec": {"containers": containers}}
    placement = assignment("c0") if placed else None
    mutated = decide(pod, placement, CONFIG)
    assert jsonpatch.apply_patch(pod, make_patch(pod, mutated)) == mutated
    assert jsonpatch.apply_patch(pod, patch_for(pod, placement, CONFIG)) == mutated
