"""Why a pod does not fit: never (no node could hold it even empty) or not now, and a message
that says what was asked and which GPUs came closest. For a pod narrowed to some nodes, which
of the others could have held it (``fitting_elsewhere``): the only case where the narrowing is
worth naming in a denial."""

import dataclasses
from collections.abc import Iterator

import numpy as np

from fracgpu.model import ContainerRequest
from fracgpu.placement.api import Constraints, NoFit, NoFitReason, PodDemand
from fracgpu.placement.candidates import CandidateFinder, fit_on_node
from fracgpu.placement.fit import host_room
from fracgpu.placement.state import BoolArray, ClusterState

MAX_CANDIDATES_IN_MESSAGE = 3
MAX_LEFT_OUT_IN_MESSAGE = 3


def explain(state: ClusterState, finder: CandidateFinder, demand: PodDemand) -> NoFit:
    asked = "; ".join(describe(c) for c in demand.containers) or "no GPU"
    pod = asked
    if demand.cpu_milli or demand.memory_mib:  # a pod without CPU or memory requests: no noise
        pod += f", {demand.cpu_milli}m CPU, {demand.memory_mib} MiB memory"
    limited = describe_constraints(demand.constraints)
    if limited:
        pod += f"; {limited}"
    left_out = _left_out(state, finder, demand)
    if not _could_ever_fit(state, finder, demand):
        return NoFit(
            NoFitReason.NEVER,
            f"no GPU node in the cluster could ever hold this pod ({pod}){left_out}: lower the "
            "request or check the GPU model, UUID and pool constraints",
        )
    gpus, _ = finder.allowed(demand.constraints)
    slots = np.flatnonzero(gpus)
    order = np.lexsort((slots, -state.g_mem_free[slots], -state.g_free[slots]))
    best = []
    for slot in slots[order[:MAX_CANDIDATES_IN_MESSAGE]]:
        device = state.devices[slot]
        row = int(state.g_node[slot])
        split = int(state.g_split[slot])
        full = (
            f" but already holds {state.g_cont[slot]} containers: the split count of its node "
            f"allows {split} per GPU"
            if state.g_cont[slot] >= split
            else ""
        )
        room = (
            "is fully used"  # "has 0 cores and 0 MiB free" says the same, less plainly
            if state.g_free[slot] == 0 and state.g_mem_free[slot] == 0
            else f"has {state.g_free[slot]} cores and {state.g_mem_free[slot]} MiB free{full}"
        )
        best.append(
            f"{state.node_names[row]}/gpu{device.index} ({device.model}) {room} "
            f"(node: {state.n_cpu_free[row]}m CPU, {state.n_mem_free[row]} MiB memory free)"
        )
    return NoFit(
        NoFitReason.NOT_NOW,
        f"no GPU has room for this pod now ({pod}){left_out}; best candidates: "
        f"{', '.join(best) or 'none'}. Controllers such as Deployments and Jobs retry; "
        "a bare pod must be created again",
    )


def _left_out(state: ClusterState, finder: CandidateFinder, demand: PodDemand) -> str:
    """The GPUs large enough for the pod that its constraints allow but that take no work:
    in MIG mode, or unhealthy."""
    if not len(state.g_live) or not demand.containers:
        return ""
    constraints = demand.constraints
    need = np.min([finder.memory_need(c) for c in demand.containers], axis=0)
    models = np.array([constraints.allows_model(m) for m in state.models] or [True])
    pools = state.n_live & np.array(
        [constraints.allows_pool(p) for p in state.n_pool], dtype=np.bool_
    ).reshape(len(state.n_pool))
    idle = ~state.g_live & models[state.g_model] & pools[state.g_node]
    idle &= need <= state.g_mem_total
    slots = [
        int(slot)
        for slot in np.flatnonzero(idle)
        if not (constraints.include_uuids or constraints.exclude_uuids)
        or constraints.allows(state.devices[slot])
    ]
    if not slots:
        return ""
    named = []
    for slot in slots[:MAX_LEFT_OUT_IN_MESSAGE]:
        device = state.devices[slot]
        why = (
            "is in MIG mode (fracgpu does not share MIG GPUs)"
            if device.mig_enabled
            else "is unhealthy"
        )
        named.append(
            f"{state.node_names[int(state.g_node[slot])]}/gpu{device.index} ({device.model}) {why}"
        )
    more = len(slots) - len(named)
    return "; left out: " + ", ".join(named) + (f" and {more} more" if more else "")


def _could_ever_fit(state: ClusterState, finder: CandidateFinder, demand: PodDemand) -> bool:
    return next(_rows_that_could_ever_fit(state, finder, demand), None) is not None


def _rows_that_could_ever_fit(
    state: ClusterState, finder: CandidateFinder, demand: PodDemand, among: BoolArray | None = None
) -> Iterator[int]:
    """The node rows (of ``among``, when given) that could hold the pod if they were empty,
    lazily: asking for the first one stops at it."""
    gpus, pools = finder.allowed(demand.constraints)
    cpu, memory = demand.cpu_milli, demand.memory_mib
    totals = state.n_cpu_total, state.n_mem_total
    nodes = pools & host_room(*totals, cpu_milli=cpu, memory_mib=memory)
    if among is not None:
        nodes &= among
    if not demand.containers:
        yield from (int(row) for row in np.flatnonzero(nodes))
        return
    needs = [finder.memory_need(c) for c in demand.containers]
    # Quick bound first: nodes with enough allowed GPUs for the widest container.
    enough = np.bincount(state.g_node, weights=gpus, minlength=len(nodes)) >= max(
        c.gpus for c in demand.containers
    )
    for row in np.flatnonzero(nodes & enough):
        if fit_on_node(state, int(row), demand, gpus, needs, empty=True) is not None:
            yield int(row)


def fitting_elsewhere(
    state: ClusterState, finder: CandidateFinder, demand: PodDemand, reason: NoFitReason
) -> tuple[str, ...]:
    """For a pod that did not fit on the nodes ``demand.constraints.nodes`` allows: the other
    nodes that could hold it under all its other constraints (models, UUIDs, pools, shape,
    CPU and memory), sorted; for NOT_NOW those with room now, for NEVER those that could
    if empty. Empty when the node narrowing makes no difference (or there is none).

    A placement pass over the left-out nodes: for a denial's words only, never on the path
    that places a pod."""
    allowed = demand.constraints.nodes
    if allowed is None:
        return ()
    left_out = np.fromiter(
        (name not in allowed for name in state.node_names), np.bool_, count=len(state.node_names)
    )
    if not left_out.any():
        return ()
    anywhere = dataclasses.replace(
        demand, constraints=dataclasses.replace(demand.constraints, nodes=None)
    )
    if reason is NoFitReason.NEVER:
        rows = list(_rows_that_could_ever_fit(state, finder, anywhere, left_out))
    else:
        rows = [int(row) for row in finder.find(anywhere).rows if left_out[row]]
    return tuple(sorted({state.node_names[row] for row in rows}))


def describe_constraints(constraints: Constraints) -> str:
    """The pod's steering and quota constraints, in words (UUID lists only counted: a pod
    may name thousands). Node narrowing is not described here: the webhook names it."""
    parts = []
    if constraints.include_models:
        parts.append(f"only GPU models {', '.join(constraints.include_models)}")
    if constraints.exclude_models:
        parts.append(f"no GPU models {', '.join(constraints.exclude_models)}")
    if constraints.include_uuids:
        parts.append(f"only {len(constraints.include_uuids)} GPUs named by UUID")
    if constraints.exclude_uuids:
        parts.append(f"not {len(constraints.exclude_uuids)} GPUs named by UUID")
    if constraints.pools:
        parts.append(f"only pools {', '.join(constraints.pools)}")
    return "; ".join(parts)


def describe(request: ContainerRequest) -> str:
    memory = (
        f"{request.memory.mib} MiB"
        if request.memory.mib is not None
        else f"{request.memory.percent}% of the card's memory"
    )
    return f'container "{request.container}": {request.gpus} GPU x {request.cores} cores + {memory}'
