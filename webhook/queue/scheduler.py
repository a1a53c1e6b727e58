"""The leader's side of the extender: may this queued pod go on these nodes now, and bind it.

kube-scheduler (the fracgpu scheduler, stock binary) proposes nodes that pass its own
checks (selectors, affinity, taints, CPU, memory, the canonical GPU resources); ``decide``
answers with the one node fracgpu's placement picks among them, in queue order
(``webhook.queue.order``), or a reason per node that says what the pod waits for and where
it stands in the queue. ``bind`` decides again for the node kube-scheduler chose, holds the
GPUs in the leader's ledger (``StateBackend.reserve``, the queued quota charge replaced by
the real one), writes the same assignment annotation and labels immediate mode writes, and
only then creates the Binding. The queue itself is the set of queued, unplaced pods in the
pod cache, so a new leader has it at once.
"""

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fracgpu import names
from fracgpu.codec import decode_assignment
from fracgpu.errors import FracgpuError
from fracgpu.model import Assignment, GPUAllocation, Reservation
from fracgpu.placement import ClusterView, NoFit, NoFitReason, Placement, PodDemand
from webhook.admission import assignments
from webhook.admission.mutate import bind_metadata
from webhook.cluster import paths
from webhook.cluster.apiclient import ApiError, KubeApi, NotFoundError
from webhook.cluster.kubestate import KubeState
from webhook.cluster.records import PodRecord
from webhook.queue import entry as queued
from webhook.queue.order import (
    HEAD_SEARCH,
    Waiter,
    asked,
    head_target,
    ordered,
    ordinal,
    place_in_line,
    still_held,
)
from webhook.rules import quota as quotalib
from webhook.state.backend import Claim, ReserveRejected

log = logging.getLogger(__name__)
# Nodes kube-scheduler offered a pod, kept for this many pods at most (oldest dropped).
MAX_REMEMBERED: Final = 10_000
PREFIX: Final = "fracgpu: "


@dataclass(frozen=True)
class Decision:
    """Where a queued pod goes now (``placement``), or why it waits (``reasons`` per node)."""

    placement: Placement | None
    reasons: Mapping[str, str]
    summary: str


class BindError(Exception):
    """The pod cannot be bound now; kube-scheduler retries it later."""


class QueueScheduler:
    def __init__(
        self,
        state: KubeState,
        api: KubeApi,
        *,
        held_wait_s: float,
        disable_core_limit: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._state = state
        self._api = api
        self._disable_core_limit = disable_core_limit
        self._held_wait_s = held_wait_s
        self._clock = clock
        self._waiting: dict[str, Waiter] = {}
        # Pod UID -> nodes kube-scheduler last offered it (its own checks passed there).
        self._offered: dict[str, frozenset[str]] = {}
        # Head UID -> the node it holds (sticky while it qualifies).
        self._held: dict[str, str] = {}
        # Pod key -> the last readable reason it waits (for its condition).
        self.last_reason: dict[str, str] = {}
        for key, record in state.pods.items():
            self._on_pod(key, None, record)
        state.pods.add_listener(self._on_pod)

    # -- the queue ---------------------------------------------------------------------------
    def _on_pod(self, key: str, _old: PodRecord | None, new: PodRecord | None) -> None:
        if new is not None and new.waiting and new.queued is not None:
            self._waiting[key] = Waiter(new.namespace, new.name, new.uid, new.queued)
            return
        gone = self._waiting.pop(key, None)
        self.last_reason.pop(key, None)
        if gone is not None:
            self._offered.pop(gone.uid, None)
            self._held.pop(gone.uid, None)

    def waiting(self) -> int:
        return len(self._waiting)

    def queue(self) -> list[Waiter]:
        return ordered(self._waiting.values())

    def placed_on(self, key: str) -> str:
        """The node a pod that left the queue was placed on ("" if it is gone or unplaced)."""
        record = self._state.pods.get(key)
        return record.node if record is not None and record.assignment is not None else ""

    def held_nodes(self) -> frozenset[str]:
        """Nodes the head of the queue holds (admission's fast path keeps off them too)."""
        return frozenset(self._held.values())

    # -- filter / prioritize -----------------------------------------------------------------
    async def decide(self, pod: Mapping[str, Any], candidates: Sequence[str]) -> Decision:
        """Where this queued pod goes among ``candidates`` now, in queue order: the pods
        ahead of it that kube-scheduler has tried are counted as placed where they fit (they
        go first), and the head, the first of them that cannot start, holds its node."""
        waiter = _waiter(pod)
        if len(self._offered) >= MAX_REMEMBERED:
            self._offered.pop(next(iter(self._offered)))
        self._offered[waiter.uid] = frozenset(candidates)
        queue = self._waiting.copy()
        queue[waiter.key] = waiter
        line = ordered(queue.values())
        position = next(i for i, w in enumerate(line, 1) if w.key == waiter.key)
        where = f"{ordinal(position)} of {len(line)} in the fracgpu queue"
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        placed_before = _placed_before(annotations, candidates)
        if placed_before is not None:
            return placed_before  # placed by a bind whose Binding failed: that node only
        carrier = self._state.liveness.carrier(
            str(annotations.get(names.ANNOTATION_RESERVATION_ID, ""))
        )
        if carrier is not None and carrier != waiter.key:
            # A genuine entry copied onto a second pod: one reservation ID places one pod.
            copied = "never: its reservation ID is carried by a placed pod (a copied queued entry)"
            return self._waits(waiter, candidates, copied, where)
        tried = [w for w in line[: position - 1] if w.uid in self._offered][:HEAD_SEARCH]
        ahead = [(w, await self._demand(w, set(self._offered[w.uid]))) for w in tried]
        alone = await self._demand(waiter, set(candidates))
        view = await self._state.view()
        head, held, placed = self._in_line(view, ahead, waiter, alone, candidates)
        if isinstance(placed, Placement):
            over = await self._quota_problem(waiter, placed, view)
            if over is None:
                return Decision(placed, {}, f"placed on {placed.node}")
            return self._waits(waiter, candidates, f"waiting for quota: {over}", where)
        on_its_own = view.place(alone, waiter.entry.policy, hold=self._holds(waiter))
        if isinstance(on_its_own, Placement):
            what = "waiting for pods ahead in the queue to start first"
        elif on_its_own.reason is NoFitReason.NEVER:
            what = f"no GPU on the offered nodes can ever hold {asked(waiter.entry)}"
        else:
            what = f"waiting for {asked(waiter.entry)}"
            if on_its_own.held:  # room there, kept for wider pods
                what += f": {on_its_own.message}"
            if head is None:  # the head: it holds the node where it will fit soonest
                target = self._target(view, waiter, alone, candidates)
                self._held = {waiter.uid: target} if target else {}
        summary = f"{what}; {where}"
        reasons = dict.fromkeys(candidates, PREFIX + summary)
        if head is not None and held in reasons:
            reasons[held] = (
                f"{PREFIX}held for {head.key}, ahead in the queue and waiting for "
                f"{asked(head.entry)}"
            )
        self.last_reason[waiter.key] = what
        return Decision(None, reasons, summary)

    def _in_line(
        self,
        view: ClusterView,
        ahead: Sequence[tuple[Waiter, PodDemand]],
        waiter: Waiter,
        demand: PodDemand,
        candidates: Sequence[str],
    ) -> tuple[Waiter | None, str, Placement | NoFit]:
        """(the head ahead, the node it holds, this pod's placement behind them). The pods
        ahead are counted in the view for the moment (synchronously: nothing else runs),
        then taken out again."""
        taken: list[tuple[str, tuple[GPUAllocation, ...], int, int]] = []
        head, held = None, ""
        try:
            for other, wanted in ahead:
                placed = view.place(wanted, other.entry.policy, hold=self._holds(other))
                if isinstance(placed, Placement):
                    used = tuple(a for c in placed.containers for a in c.devices)
                    view.allocate(placed.node, used, wanted.cpu_milli, wanted.memory_mib)
                    taken.append((placed.node, used, wanted.cpu_milli, wanted.memory_mib))
                    continue
                held = self._target(view, other, wanted, sorted(wanted.constraints.nodes or ()))
                self._held = {other.uid: held} if held else {}
                head = other
                break
            allowed = frozenset(candidates) - {held}
            narrowed = dataclasses.replace(
                demand, constraints=dataclasses.replace(demand.constraints, nodes=allowed)
            )
            return head, held, view.place(narrowed, waiter.entry.policy, hold=self._holds(waiter))
        finally:
            for node, used, cpu, memory in taken:
                view.release(node, used, cpu, memory)

    def _holds(self, waiter: Waiter) -> bool:
        return still_held(waiter.entry, self._clock(), self._held_wait_s)

    def _target(
        self, view: ClusterView, waiter: Waiter, demand: PodDemand, offered: Sequence[str]
    ) -> str:
        previous = self._held.get(waiter.uid, "")
        return head_target(
            view, waiter.entry, demand, offered, previous=previous, held=self._holds(waiter)
        )

    def _waits(self, waiter: Waiter, candidates: Sequence[str], what: str, where: str) -> Decision:
        self.last_reason[waiter.key] = what
        summary = f"{what}; {where}"
        return Decision(None, dict.fromkeys(candidates, PREFIX + summary), summary)

    async def _demand(self, waiter: Waiter, nodes: set[str] | None) -> PodDemand:
        demand = waiter.entry.demand()
        pools = quotalib.allowed_pools(await self._state.quotas(waiter.namespace))
        constraints = dataclasses.replace(
            demand.constraints,
            nodes=None if nodes is None else frozenset(nodes),
            pools=demand.constraints.pools if pools is None else pools,
        )
        return dataclasses.replace(demand, constraints=constraints)

    async def _quota_problem(
        self, waiter: Waiter, placed: Placement, view: ClusterView
    ) -> str | None:
        """Why the real GPUs would break a quota the queued charge did not (per-model
        limits), or a namespace over quota (queued while no leader could count): None if
        the pod may go. Queued pods of a namespace are let in in queue order."""
        quotas = await self._state.quotas(waiter.namespace)
        if not quotas:
            return None
        inventory = view.inventory(placed.node)
        models = {d.uuid: d.model for d in inventory.devices} if inventory else {}
        allocations = [a for c in placed.containers for a in c.devices]
        # The quotas count every queued charge: take back this pod's and those behind it.
        credit = (*waiter.entry.charge(), *self._behind(waiter))
        base = [quotalib.charge(q, credit, {}, -1) for q in quotas]
        over = quotalib.check(base, allocations, models)
        return None if over is None else over.message

    def _behind(self, waiter: Waiter) -> tuple[GPUAllocation, ...]:
        """The queued charges of the pods behind this one in its namespace."""
        mine = place_in_line(waiter)
        return tuple(
            a
            for other in self._waiting.values()
            if other.namespace == waiter.namespace and place_in_line(other) > mine
            for a in other.entry.charge()
        )

    # -- bind --------------------------------------------------------------------------------
    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Place the pod on ``node`` and bind it there, or raise ``BindError``."""
        try:
            pod = await self._api.get(paths.pod(namespace, name))
        except NotFoundError:
            raise BindError(f"pod {namespace}/{name} is gone") from None
        meta = pod.get("metadata") or {}
        if uid and meta.get("uid") != uid:
            raise BindError(f"pod {namespace}/{name} was replaced (UID changed)")
        annotations = meta.get("annotations") or {}
        if (pod.get("spec") or {}).get("nodeName"):
            return  # bound already
        raw = annotations.get(names.ANNOTATION_ASSIGNMENT)
        if raw is None:
            assignment = await self._place(pod, node)
        else:  # placed by an earlier bind whose Binding failed: bind where it was placed
            try:
                assignment = decode_assignment(raw)
            except FracgpuError as error:
                raise BindError(f"pod {namespace}/{name}: {error}") from None
            if assignment.node != node:
                raise BindError(f"pod {namespace}/{name} is placed on {assignment.node}")
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": meta.get("uid")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self._api.create(paths.pod_binding(namespace, name), binding)
        except ApiError as error:
            raise BindError(f"binding {namespace}/{name} to {node} failed: {error}") from None
        log.info("bound queued pod %s/%s to %s", namespace, name, node)

    async def _place(self, pod: Mapping[str, Any], node: str) -> Assignment:
        waiter = _waiter(pod)
        meta = pod["metadata"]
        decision = await self.decide(pod, [node])
        if decision.placement is None:
            raise BindError(f"{waiter.key} cannot go on {node} now: {decision.summary}")
        placed = decision.placement
        view = await self._state.view()
        reservation_id = str((meta.get("annotations") or {}).get(names.ANNOTATION_RESERVATION_ID))
        entry = waiter.entry
        assignment = assignments.build(
            placed.node,
            reservation_id,
            placed.containers,
            requests=entry.requests,
            view=view,
            disable_core_limit=self._disable_core_limit,
        )
        inventory = view.inventory(placed.node)
        models = {d.uuid: d.model for d in inventory.devices} if inventory else {}
        hold = Reservation(
            reservation_id, placed.node, waiter.namespace, waiter.name, assignment.allocations(), 0
        )
        claim = Claim(
            hold,
            entry.cpu_milli,
            entry.memory_mib,
            models,
            replaces=entry.charge(),
            behind=self._behind(waiter),
        )
        try:
            await self._state.reserve(claim)
        except ReserveRejected as rejected:
            raise BindError(f"{waiter.key}: {rejected.message}") from None
        await self._state.confirm(reservation_id, waiter.name)
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                **bind_metadata(assignment),
            }
        }
        try:
            await self._api.patch(paths.pod(waiter.namespace, waiter.name), patch)
        except ApiError as error:
            await self._state.release(reservation_id)
            raise BindError(f"writing the assignment of {waiter.key} failed: {error}") from None
        return assignment


def _placed_before(annotations: Mapping[str, Any], candidates: Sequence[str]) -> Decision | None:
    """The decision for a queued pod that already carries its assignment: its node, if
    offered, else every offered node refused with the reason."""
    raw = annotations.get(names.ANNOTATION_ASSIGNMENT)
    if not isinstance(raw, str):
        return None
    try:
        assignment = decode_assignment(raw)
    except FracgpuError as error:
        return Decision(None, dict.fromkeys(candidates, f"{PREFIX}{error}"), str(error))
    if assignment.node in candidates:
        placement = Placement(assignment.node, assignment.containers)
        return Decision(placement, {}, f"placed on {assignment.node}")
    why = f"placed on {assignment.node} already"
    return Decision(None, dict.fromkeys(candidates, PREFIX + why), why)


def _waiter(pod: Mapping[str, Any]) -> Waiter:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    raw = annotations.get(names.ANNOTATION_QUEUED)
    if not isinstance(raw, str):
        raise BindError(
            f"pod {meta.get('namespace')}/{meta.get('name')} was not queued by fracgpu "
            f"(no {names.ANNOTATION_QUEUED} annotation): only pods fracgpu queued use this "
            "scheduler"
        )
    try:
        entry = queued.decode(raw)
    except FracgpuError as error:
        raise BindError(str(error)) from None
    return Waiter(
        str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")), entry
    )
