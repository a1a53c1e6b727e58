"""The queue's pure parts (issue 21): the queued entry's codec and seal, the order, the words
of a reason, and the node the head holds."""

import dataclasses

import orjson
import pytest

from fracgpu.errors import CodecError
from fracgpu.model import (
    WHOLE_CARD,
    ContainerRequest,
    GPUAllocation,
    GPUDevice,
    MemoryRequest,
    NodeInventory,
)
from fracgpu.placement import ClusterView, Constraints, NoFit, Placement, PodDemand, Policy
from tests.placement.helpers import reserve_cluster
from webhook.queue import entry as queued
from webhook.queue.order import (
    Waiter,
    asked,
    head_target,
    ordered,
    ordinal,
    still_held,
    target_node,
)

KEY = b"k" * 32
FRAG = Policy.FRAGMENTATION


def entry(
    cores: int = 60,
    gpus: int = 1,
    *,
    high: bool = False,
    priority: int = 0,
    at: int = 1000,
    percent: int | None = None,
) -> queued.QueuedEntry:
    memory = MemoryRequest(percent=percent) if percent else MemoryRequest(mib=4096)
    demand = PodDemand(
        (ContainerRequest("main", gpus, cores, memory),),
        500,
        1024,
        Constraints(include_models=("A100",)),
    )
    return queued.new_entry(
        demand,
        Policy.BINPACK,
        high_priority=high,
        pod_priority=priority,
        queued_at_ms=at,
        charged_mib=[4096],
    )


def test_the_entry_round_trips_and_its_seal_binds_namespace_and_reservation() -> None:
    sealed = entry(percent=50).sealed(KEY, "team", "r-1")
    decoded = queued.decode(queued.encode(sealed))
    assert decoded == sealed
    assert decoded.seal_holds(KEY, "team", "r-1")
    assert not decoded.seal_holds(KEY, "other", "r-1")
    assert not decoded.seal_holds(KEY, "team", "r-2")
    assert not decoded.seal_holds(b"x" * 32, "team", "r-1")
    assert not dataclasses.replace(decoded, queued_at_ms=0).seal_holds(KEY, "team", "r-1")


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda e: {**e, "version": 2}, "version 2 is not supported"),
        (lambda e: {**e, "extra": 1}, "needs exactly the fields"),
        (lambda e: {**e, "containers": []}, "names no container"),
        (lambda e: {**e, "policy": "greedy"}, "policy 'greedy' is unknown"),
        (lambda e: {**e, "podPriority": True}, "podPriority must be a whole number"),
        (
            lambda e: {**e, "containers": [{**e["containers"][0], "cores": 101}]},
            "cores must be 0-100",
        ),
        (
            lambda e: {**e, "containers": [{**e["containers"][0], "memoryPercent": 50}]},
            "exactly one of memoryMiB or memoryPercent",
        ),
    ],
)
def test_decoding_is_strict_and_says_what_is_wrong(edit: object, problem: str) -> None:
    raw = orjson.loads(queued.encode(entry()))
    text = orjson.dumps(edit(raw)).decode()  # type: ignore[operator]
    with pytest.raises(CodecError, match=problem):
        queued.decode(text)


def test_the_charge_is_per_gpu_on_no_card() -> None:
    charged = entry(cores=100, gpus=2).charge()
    assert [(a.uuid, a.cores, a.memory_mib) for a in charged] == [("", 100, 4096)] * 2


def waiter(name: str, **kwargs: object) -> Waiter:
    return Waiter("team", name, f"uid-{name}", entry(**kwargs))  # type: ignore[arg-type]


def test_order_is_granted_priority_then_pod_priority_then_arrival() -> None:
    line = [
        waiter("late-low", at=3000),
        waiter("early-low", at=1000),
        waiter("class-high", at=5000, priority=1000),
        waiter("granted", at=9000, high=True),
    ]
    assert [w.name for w in ordered(line)] == ["granted", "class-high", "early-low", "late-low"]


def test_ordinals_and_reasons_read_as_english() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
    ]  # fmt: skip
    assert asked(entry()) == "60 vcuda-core and 4096 MiB on one GPU (only GPU models A100)"
    assert asked(entry(cores=100)).startswith("a whole GPU")
    assert asked(entry(cores=100, gpus=4)).startswith("4 whole GPUs")
    assert "50% of the memory" in asked(entry(percent=50))


def node(name: str, gpus: int, model: str = "NVIDIA A100-SXM4-40GB") -> NodeInventory:
    devices = tuple(GPUDevice(f"{name}-{i}", i, model, 40960) for i in range(gpus))
    return NodeInventory(name, devices, 64000, 262144)


def test_the_head_holds_the_node_with_most_of_its_ask_free_and_keeps_it() -> None:
    view = ClusterView([node("a", 2), node("b", 2), node("t4", 8, "Tesla T4")])
    whole = entry(cores=100, gpus=2).demand()
    view.allocate("a", [view_allocation("a-0", 70)])
    view.allocate("b", [view_allocation("b-0", 30)])
    # b has more free; t4 has more GPUs but not the model the pod may use.
    assert target_node(view, whole, ["a", "b", "t4"], "") == "b"
    assert target_node(view, whole, ["a", "b", "t4"], "a") == "a", "sticky while it qualifies"
    assert target_node(view, whole, ["a", "b", "t4"], "t4") == "b", "not a node it can use"
    assert target_node(view, whole, ["t4"], "") == "", "no node it could ever use"


def held_out_entry(policy: Policy = FRAG, at: int = 1000) -> queued.QueuedEntry:
    """A queued 1-GPU pod, in ``reserve_cluster`` with s1 and s2 full: only "big" has room,
    and it is the last host of the 8-GPU pods still expected (test_held_nodes.py)."""
    demand = PodDemand((ContainerRequest("main", 1, 100, WHOLE_CARD),), cpu_milli=4000)
    return queued.new_entry(
        demand, policy, high_priority=False, pod_priority=0, queued_at_ms=at, charged_mib=[0]
    )


def full_but_big() -> ClusterView:
    view = reserve_cluster()
    for name in ("s1", "s2"):
        cpu, _ = view.node_free(name)
        used = [GPUAllocation(f"{name}-gpu{i}", 100, 0) for i in range(8)]
        view.allocate(name, used, cpu)
    return view


def test_the_head_never_holds_a_node_kept_whole_for_wider_pods() -> None:
    """Placement holds "big" from the 1-GPU pod. Were the waiting pod to hold it in turn, the
    8-GPU pods behind would be shut out of it too, and neither would start: it holds a full
    node instead, one kube-scheduler offered, else any it may use (kube-scheduler offers
    only nodes with CPU free, here just "big"), so newer pods still keep off the room it
    waits for. Once it may take held nodes, or under a policy that holds nothing, "big"."""
    view, waiting = full_but_big(), held_out_entry()
    demand = waiting.demand()
    everything = ["big", "s1", "s2"]
    assert head_target(view, waiting, demand, everything, previous="", held=True) == "s1"
    assert head_target(view, waiting, demand, everything, previous="big", held=True) == "s1"
    assert head_target(view, waiting, demand, ["big"], previous="", held=True) == "s1"
    assert head_target(view, waiting, demand, everything, previous="", held=False) == "big"
    plain = held_out_entry(Policy.BEST_FIT)
    assert head_target(view, plain, demand, everything, previous="", held=True) == "big"


def test_a_held_pod_waits_held_wait_seconds_at_most() -> None:
    """In a quiet cluster nothing lowers the expectation of wide pods, so the hold lasts as
    long as the pod has waited less than the setting; then ``place(hold=False)`` lets it on."""
    view, waiting = full_but_big(), held_out_entry(at=1_000_000)
    assert still_held(waiting, 1_000 + 299.9, 300)
    assert not still_held(waiting, 1_000 + 300, 300)
    refused = view.place(waiting.demand(), FRAG)
    assert isinstance(refused, NoFit) and refused.held
    placed = view.place(waiting.demand(), FRAG, hold=False)
    assert isinstance(placed, Placement) and placed.node == "big"


def view_allocation(uuid: str, cores: int) -> GPUAllocation:
    return GPUAllocation(uuid, cores, 1024)
