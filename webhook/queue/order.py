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
from fracgpu.placement import ClusterView, PodDemand, Policy
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
    view: ClusterView, demand: PodDemand, policy: Policy, allowed: Sequence[str], previous: str
) -> str:
    """The node the head holds: where the most of its ask is free now, among the nodes it
    may use that could hold it when empty. Sticky: the previous choice while it qualifies.
    Never a node placement holds from it (``ClusterView.held_from``): those are kept whole
    for wider pods, which the head's hold would then shut out too, and neither would start."""
    best, best_score = "", (-1, -1)
    need = max((r.gpus for r in demand.containers), default=1)
    held_off = view.held_from(demand, policy)
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
