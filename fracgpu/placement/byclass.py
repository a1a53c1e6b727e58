"""The fragmentation policy for one-GPU pods, decided pair by pair instead of GPU by GPU.

Every GPU slot of a (node class, GPU class) pair fits and scores alike (``classes``), and
ties go to the lowest slot, so the winner is the lowest slot of the best pair. A pair's fit
and scores depend only on what its ids stand for, the demand and the workload, so they are
cached per demand until ids are renumbered or the workload changes: in a cluster of many
alike nodes a decision is then a lookup per pair, not a scan of every GPU. Scores come from
the same code (``PolicyKeys``, ``FragmentationIndex.loss``) and ties are broken by the same
rule as ``scoring.lexmin`` (``scoring.tie_limit``), so the winner is the one scoring every
candidate would pick.
"""

from collections.abc import Hashable
from typing import Final

import numpy as np

from fracgpu.model import ContainerAssignment, ContainerRequest, GPUAllocation
from fracgpu.placement.api import Placement, PodDemand
from fracgpu.placement.candidates import Candidates
from fracgpu.placement.classes import NodeFeatures, SlotFeatures, StateClasses
from fracgpu.placement.fit import gpu_room, host_room
from fracgpu.placement.fragmentation import FragmentationIndex
from fracgpu.placement.pairs import Pair
from fracgpu.placement.scarcity import NOT_UNTOUCHED
from fracgpu.placement.scoring import PolicyKeys, tie_limit
from fracgpu.placement.state import ClusterState

# Past this many pairs (nodes mostly in states of their own) the vectorised scan is cheaper.
MAX_PAIRS: Final = 256
# Bounds on the caches: distinct demand shapes, and scores kept per shape.
MAX_DEMANDS: Final = 256
MAX_SCORES: Final = 8 * MAX_PAIRS
# (fragmentation loss, node's free compute after, GPU left after), as cached.
Score = tuple[float, float, float]
# A pair's cached answer: its GPUs' memory take and score, or None when they do not fit.
Fit = tuple[int, Score] | None
# What a decision compares, smallest first key by key: (1 on one of the last nodes of a
# reserved kind else 0, loss plus the scarcity cost, then the cached score's other keys).
Ranked = tuple[float, float, float, float]


class ClassChooser:
    """Caches fits and scores by (demand, pair) between decisions."""

    def __init__(self) -> None:
        self._fits: dict[Hashable, dict[Pair, Fit]] = {}
        # Node class -> its kind in the scarcity table: fixed while ids and the table are.
        self._kinds: dict[int, int] = {}
        self._version = (-1, -1, -1)

    def place(
        self, state: ClusterState, frag: FragmentationIndex, demand: PodDemand
    ) -> Placement | None:
        """The fragmentation policy's placement, or None when this path does not apply (several
        GPUs or containers, GPUs named by UUID, pools, too many pairs) or nothing fits: the
        caller then scans every GPU, and says why nothing fits."""
        request = _single_gpu_request(demand)
        classes = frag.current_classes(state)
        if request is None or classes is None or len(classes.pairs) > MAX_PAIRS:
            return None
        fits = self._fits_for(classes, frag, demand, request)
        pairs = classes.pairs
        live = pairs.pairs()
        missing = [p for p in live if p not in fits]
        if missing:
            _fill(
                fits,
                missing,
                state=state,
                frag=frag,
                classes=classes,
                demand=demand,
                request=request,
            )
        options: list[tuple[int, tuple[int, Ranked]]] = []
        scarce = frag.scarce_costs_apply()
        for pair in live:
            fit = fits[pair]
            if fit is None:
                continue
            slot = pairs.lowest(pair)
            need, (loss, free_after, gpu_left) = fit
            reserved = 0.0
            # Left out of the cached score: they change as other nodes are opened.
            if scarce:
                kind = self._kind(pair[0], slot, state, frag)
                if kind != NOT_UNTOUCHED:
                    loss += frag.scarce_cost_of_kind(state, kind)
                    reserved = frag.kind_reserved(state, kind)
            options.append((slot, (need, (reserved, loss, free_after, gpu_left))))
        if not options:
            return None
        slot, (take_mem, _) = _best(options)
        uuid = state.devices[slot].uuid
        held = ContainerAssignment(
            request.container, (GPUAllocation(uuid, request.cores, take_mem),)
        )
        return Placement(state.node_names[int(state.g_node[slot])], (held,))

    def _fits_for(
        self,
        classes: StateClasses,
        frag: FragmentationIndex,
        demand: PodDemand,
        request: ContainerRequest,
    ) -> dict[Pair, Fit]:
        version = (classes.version, frag.version, frag.scarcity.version)
        if version != self._version:
            self._fits.clear()
            self._kinds.clear()
            self._version = version
        c = demand.constraints
        key = (
            request.cores,
            request.memory.mib,  # the fields, not the dataclass: its hash runs Python code
            request.memory.percent,
            demand.cpu_milli,
            demand.memory_mib,
            c.include_models,
            c.exclude_models,
            c.exact_models,
        )
        fits = self._fits.get(key)
        if fits is None or len(fits) > MAX_SCORES:  # pairs come and go: start over now and then
            if len(self._fits) >= MAX_DEMANDS:
                self._fits.clear()
            fits = self._fits[key] = {}
        return fits

    def _kind(self, node_id: int, slot: int, state: ClusterState, frag: FragmentationIndex) -> int:
        """The scarcity kind of node class ``node_id``, read from the node of ``slot``."""
        kind = self._kinds.get(node_id)
        if kind is None:
            kind = self._kinds[node_id] = int(frag.scarcity.row_kind[int(state.g_node[slot])])
        return kind


def _single_gpu_request(demand: PodDemand) -> ContainerRequest | None:
    """The one request of a one-container, one-GPU demand whose constraints are per model only."""
    if len(demand.containers) != 1:
        return None
    request = demand.containers[0]
    c = demand.constraints
    if request.gpus != 1 or c.include_uuids or c.exclude_uuids or c.pools or c.nodes is not None:
        return None
    return request


def _fill(
    fits: dict[Pair, Fit],
    missing: list[Pair],
    *,
    state: ClusterState,
    frag: FragmentationIndex,
    classes: StateClasses,
    demand: PodDemand,
    request: ContainerRequest,
) -> None:
    """Fit and score the pairs not cached yet, scoring the lowest slot of each that fits."""
    fitting: list[tuple[Pair, int]] = []
    for pair in missing:
        need = _memory_taken(
            state, demand, request, classes.node_features[pair[0]], classes.slot_features[pair[1]]
        )
        if need is None:
            fits[pair] = None
        else:
            fitting.append((pair, need))
    if not fitting:
        return
    slots = np.array([classes.pairs.lowest(p) for p, _ in fitting], dtype=np.int64)
    n = len(slots)
    cands = Candidates(
        state.g_node[slots],
        None,
        slots,
        np.full(n, request.cores, np.int64),
        np.array([need for _, need in fitting], dtype=np.int64),
        np.ones(n, np.int64),
        lambda _i: (),
    )
    keys = PolicyKeys(cands, state, demand)
    loss = frag.loss(state, cands, demand.cpu_milli, demand.memory_mib, distinct=True, scarce=False)
    scores = zip(
        loss.tolist(),
        keys.node_free_after(None).tolist(),
        keys.gpu_left(None).tolist(),
        strict=True,
    )
    for (pair, need), score in zip(fitting, scores, strict=True):
        fits[pair] = (need, score)


def _memory_taken(
    state: ClusterState,
    demand: PodDemand,
    request: ContainerRequest,
    node: NodeFeatures,
    gpu: SlotFeatures,
) -> int | None:
    """The GPU memory a one-GPU request takes on a GPU of this class on a node of this class,
    or None when it does not fit there (``CandidateFinder``'s rules, on one class)."""
    model, free, containers, mem_free, mem_total, split, live = gpu
    if not live or not host_room(
        node[0], node[1], cpu_milli=demand.cpu_milli, memory_mib=demand.memory_mib
    ):
        return None
    if not demand.constraints.allows_model(state.models[model]):
        return None
    need = request.memory.resolve(mem_total)
    room = gpu_room(
        free,
        mem_free,
        containers,
        mem_total,
        split,
        cores=request.cores,
        memory=need,
        units=state.gpu_units,
    )
    return need if room else None


def _best(options: list[tuple[int, tuple[int, Ranked]]]) -> tuple[int, tuple[int, Ranked]]:
    """``scoring.lexmin`` over (lowest slot, (memory, score)) options: smallest score key by
    key, near-equal floats tie (``scoring.tie_limit``), the lowest slot wins a full tie. A
    loop over the few cached options: arrays for ``lexmin`` itself cost 9 % more
    instructions per admission (958,005 -> 1,042,542, admission-cost, 100 x 8)."""
    if len(options) == 1:
        return options[0]
    alive = sorted(options, key=lambda o: o[0])
    for k in range(4):
        if len(alive) == 1:
            break
        limit = tie_limit(min(o[1][1][k] for o in alive))
        alive = [o for o in alive if o[1][1][k] <= limit]
    return alive[0]
