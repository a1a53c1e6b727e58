"""The queue's order and its rule against starvation, pure.

Order: a granted high fracgpu priority first, then the pod's priority (PriorityClass), then
arrival (when admission queued it), then name. Against starvation (EASY backfill): the
*head*, the first waiting pod in that order that cannot start now, holds one node, the one
where it will fit soonest (most of the room it asks already free). Pods behind the head
start only on other nodes, so a stream of small pods cannot keep taking the room a large
pod waits for; they still fill every other node (backfill). Only the first few waiting
pods are tried when looking for the head (``HEAD_SEARCH``), so one decision stays cheap
with a long queue.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from fracgpu.model import GPUDevice
from fracgpu.placement import ClusterView, PodDemand
from fracgpu.placement.nofit import describe, describe_constraints
from webhook.queue.entry import QueuedEntry

HEAD_SEARCH: Final = 32


@dataclass(frozen=True, slots=True)
class Waiter:
    namespace: str
    name: str
    uid: str
    entry: QueuedEntry

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def place_in_line(waiter: Waiter) -> tuple[tuple[int, int, int], str, str]:
    return (waiter.entry.rank(), waiter.namespace, waiter.name)


def ordered(waiting: Iterable[Waiter]) -> list[Waiter]:
    return sorted(waiting, key=place_in_line)


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def asked(entry: QueuedEntry) -> str:
    """What the pod waits for, in words: cores, memory, model, whole GPUs."""
    parts = []
    for request in entry.requests:
        if request.gpus > 1 or request.cores >= 100:
            whole = "whole GPUs" if request.gpus > 1 else "a whole GPU"
            parts.append(
                f"{request.gpus if request.gpus > 1 else ''} {whole}".strip()
                + (f" ({describe(request)})" if len(entry.requests) > 1 else "")
            )
        else:
            memory = (
                f"{request.memory.mib} MiB"
                if request.memory.mib is not None
                else f"{request.memory.percent}% of the memory"
            )
            parts.append(f"{request.cores} vcuda-core and {memory} on one GPU")
    limited = describe_constraints(entry.constraints)
    return " + ".join(parts) + (f" ({limited})" if limited else "")


def target_node(
    view: ClusterView,
    demand: PodDemand,
    allowed: Sequence[str],
    previous: str,
    held_off: frozenset[str] | None = None,
) -> str:
    """The node the head holds: where the most of its ask is free now, among the nodes it
    may use that could hold it when empty. Sticky: the previous choice while it qualifies.
    Never one of ``held_off``, the nodes placement holds from it (``ClusterView.held_from``):
    those are kept whole for wider pods, which the head's hold would shut out too, and
    neither would start."""
    best, best_score = "", (-1, -1)
    need = max((r.gpus for r in demand.containers), default=1)
    held_off = held_off or frozenset()
    for name in allowed:
        if name in held_off:
            continue
        node = view.inventory(name)
        if node is None or not demand.constraints.allows_pool(node.pool):
            continue
        usable = [d for d in node.devices if _usable(d, demand)]
        if len(usable) < need:
            continue
        if name == previous:
            return name
        free = [view.gpu_free(name, d.uuid) for d in usable]
        score = (sum(f[0] for f in free), sum(f[1] for f in free))
        if score > best_score or (score == best_score and name < best):
            best, best_score = name, score
    return best


def _usable(device: GPUDevice, demand: PodDemand) -> bool:
    return device.healthy and not device.mig_enabled and demand.constraints.allows(device)


def still_held(entry: QueuedEntry, now_s: float, held_wait_s: float) -> bool:
    """Whether placement may still hold nodes from this queued pod for wider pods
    (``ClusterView.held_from``): until it has waited ``held_wait_s``, so that in a quiet
    cluster, where no arrival lowers the expectation of wide pods, it does not wait forever
    beside an empty node."""
    return now_s * 1000 - entry.queued_at_ms < held_wait_s * 1000


def head_target(
    view: ClusterView,
    entry: QueuedEntry,
    demand: PodDemand,
    offered: Sequence[str],
    *,
    previous: str,
    held: bool,
) -> str:
    """The node the queue head holds (``target_node``): among the nodes kube-scheduler
    offered it (``demand`` is narrowed to them), never one placement holds from it while
    ``held``. When the offered ones are all held from it (kube-scheduler offers only nodes
    with CPU and memory free, often just those), among every node it may use, so that newer
    pods still keep off the room it waits for."""
    held_off = view.held_from(demand, entry.policy) if held else None
    target = target_node(view, demand, offered, previous, held_off)
    if target or not held_off:
        return target
    own = entry.constraints.nodes
    usable = own if own is not None else {n.name for n in view.nodes()}
    return target_node(view, demand, sorted(usable - held_off), previous, held_off)
