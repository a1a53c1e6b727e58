"""Which queued pod's container an Allocate may be for (agent.queuedelivery.candidates), and
reading the node's pods from hostile JSON (agent.nodepods)."""

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.deviceplugin.units import ResourceKind
from agent.nodepods import NodePod, PodContainer, parse_node_pod
from agent.podresources import KnownPods
from agent.queuedelivery import candidates
from fracgpu.codec import encode_assignment
from fracgpu.model import Assignment, ContainerAssignment, GPUAllocation
from fracgpu.names import ANNOTATION_ASSIGNMENT, ANNOTATION_QUEUED

NODE = "n1"
CORE = "tencent.com/vcuda-core"


def pod(name: str, at: str, containers: dict[str, int], node: str = NODE) -> NodePod:
    assignment = Assignment(
        node=node,
        reservation_id=name,
        containers=tuple(
            ContainerAssignment(c, (GPUAllocation(f"GPU-{name}-{c}", cores, 1024),))
            for c, cores in containers.items()
        ),
    )
    return NodePod(
        namespace="ns",
        name=name,
        uid=f"u-{name}",
        queued=True,
        assignment=encode_assignment(assignment),
        phase="Pending",
        deleting=False,
        scheduled_at=at,
        created_at=at,
        containers=tuple(PodContainer(c, "", started=False) for c in containers),
    )


def known(
    *pods: NodePod, holding: dict[tuple[str, str], frozenset[str]] | None = None
) -> KnownPods:
    holding = holding or {}
    return {
        (p.namespace, p.name): {
            c.name: holding.get((p.name, c.name), frozenset()) for c in p.containers
        }
        for p in pods
    }


def chosen(pods: list[NodePod], count: int, **kwargs: Any) -> list[tuple[str, str]]:
    options: dict[str, Any] = {"known": known(*pods), "served": set()} | kwargs
    found = candidates(
        node=NODE, resource=CORE, kind=ResourceKind.COMPUTE, count=count, pods=pods, **options
    )
    return [(c.pod.name, c.container.name) for c in found]


def test_bound_last_first_and_one_container_per_pod() -> None:
    young = pod("young", "2026-01-01T00:00:09Z", {"a": 30, "b": 30})
    old = pod("old", "2026-01-01T00:00:01Z", {"a": 30, "b": 30})
    assert chosen([old, young], 30) == [("young", "a"), ("old", "a")]
    # same second: created last first; no bind time: last of all
    twin = replace(old, name="twin", created_at="2026-01-01T00:00:00Z")
    unbound = replace(young, name="unbound", scheduled_at="")
    assert chosen([twin, unbound, old], 30) == [("old", "a"), ("twin", "a"), ("unbound", "a")]


def test_counts_must_match_and_kubelet_order_is_kept() -> None:
    p = pod("p", "t", {"init": 10, "a": 30, "b": 50})
    assert chosen([p], 50) == [("p", "b")]
    assert chosen([p], 10) == [("p", "init")]
    assert chosen([p], 40) == []


def test_served_holding_started_containers_are_skipped() -> None:
    p = pod("p", "t", {"a": 30, "b": 30, "c": 30})
    p = replace(
        p, containers=(p.containers[0], replace(p.containers[1], started=True), p.containers[2])
    )
    served = {("u-p", "a", CORE)}
    assert chosen([p], 30, served=served) == [("p", "c")]
    holding = known(p, holding={("p", "c"): frozenset({CORE})})
    assert chosen([p], 30, served=served, known=holding) == []
    # holding the other resource does not count as served for this one
    other = known(p, holding={("p", "a"): frozenset({"tencent.com/vcuda-memory"})})
    assert chosen([p], 30, known=other) == [("p", "a")]


def test_pods_that_cannot_be_the_one_admitted_are_left_out() -> None:
    base = pod("p", "t", {"a": 30})
    not_taken_in: KnownPods = {}
    assert chosen([base], 30, known=not_taken_in) == []
    assert chosen([base], 30, known=None) == [("p", "a")]  # pod-resources unreadable
    for other in (
        replace(base, queued=False),
        replace(base, assignment=None),
        replace(base, assignment="not an assignment"),
        replace(base, deleting=True),
        replace(base, phase="Failed"),
        replace(base, phase="Running"),
        pod("p", "t", {"a": 30}, node="elsewhere"),
        replace(base, containers=(PodContainer("not-assigned", "", started=False),)),
    ):
        assert chosen([other], 30) == [], other


def test_a_pod_is_read_from_the_api_json() -> None:
    raw = {
        "metadata": {
            "namespace": "ns",
            "name": "p",
            "uid": "u",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {ANNOTATION_QUEUED: "", ANNOTATION_ASSIGNMENT: "x"},
        },
        "spec": {
            "initContainers": [{"name": "i"}],
            "containers": [
                {"name": "a", "envFrom": [{"configMapRef": {"name": "c"}}]},
                {"name": "b"},
            ],
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "x"},
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastTransitionTime": "2026-01-01T00:00:02Z",
                },
            ],
            "containerStatuses": [
                {"name": "b", "state": {"waiting": {}}, "lastState": {"terminated": {}}}
            ],
        },
    }
    parsed = parse_node_pod(raw)
    assert parsed is not None
    assert (parsed.queued, parsed.assignment, parsed.phase, parsed.deleting) == (
        True,
        "x",
        "Pending",
        False,
    )
    assert parsed.scheduled_at == "2026-01-01T00:00:02Z"
    assert [c.name for c in parsed.containers] == ["i", "a", "b"]
    assert [c.started for c in parsed.containers] == [False, False, True]
    assert "envFrom[0] has no prefix" in parsed.containers[1].visible_devices_override
    assert parse_node_pod({"metadata": {"name": "p"}}) is None


KEYS = st.sampled_from(
    ["metadata", "spec", "status", "name", "namespace", "annotations", "containers",
     "initContainers", "env", "envFrom", "conditions", "containerStatuses", "state", "prefix",
     "type", "uid", "deletionTimestamp"]
)  # fmt: skip
# Small JSON whose keys are mostly the ones read, so the parser meets odd types where it looks.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from(["", "True", "PodScheduled"]),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=10,
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, JSON, max_size=3))
def test_hostile_json_never_raises(raw: dict[str, Any]) -> None:
    parse_node_pod(raw)
