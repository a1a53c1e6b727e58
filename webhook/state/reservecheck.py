"""Whether a claim can be held now: one check for every state back end.

Run with no await between it and taking the claim, so that no other reservation can take
the same room in between.
"""

from collections.abc import Iterable, Mapping

from fracgpu.model import Quota
from fracgpu.placement import ClusterView
from webhook.rules import quota as quotalib
from webhook.rules.capacity import capacity_problem
from webhook.state.backend import Claim, RejectKind, ReserveRejected


def reserve_problem(
    view: ClusterView,
    claim: Claim,
    quotas: Iterable[Quota],
    models: Mapping[str, str],
    *,
    split_count: int,
) -> ReserveRejected | None:
    """Why ``claim`` cannot be held: its node lacks room for it (a queued pod's claim, on no
    node, holds no GPU and is not checked there), or ``quotas`` (its namespace's) lack room,
    less what the claim replaces and the queued charges behind it; None when it fits."""
    held = claim.reservation
    if held.node:
        problem = capacity_problem(
            view,
            held.node,
            held.allocations,
            cpu_milli=claim.cpu_milli,
            memory_mib=claim.memory_mib,
            split_count=split_count,
        )
        if problem:
            return ReserveRejected(RejectKind.CAPACITY, problem)
    # A queued pod being placed: its queued charge is given back as the real one is taken.
    credit = (*claim.replaces, *claim.behind)
    without = [quotalib.charge(q, credit, {}, -1) for q in quotas]
    over = quotalib.check(without, held.allocations, models)
    if over is not None:
        return ReserveRejected(RejectKind.QUOTA, over.message)
    return None
