"""Admission decisions: the mutating and validating rules over a ``StateBackend``.

Mutation (CREATE): opted-out namespaces and non-pod objects pass untouched; a pod without
GPUs gets ``NVIDIA_VISIBLE_DEVICES=void``; a GPU pod is checked (dialect, tampering),
placed, quota-checked, reserved (unless dry-run) and rewritten. A pod that already carries
a verified assignment (reinvocation) is rewritten with that assignment, never placed again.

Validation (CREATE, UPDATE): dialect rules, tampering, and on CREATE that every GPU pod
carries exactly what fracgpu wrote for a reservation it holds; a CREATE that passes confirms
that reservation (unconfirmed ones are given back: a later admission step refused the pod).

Both refuse the doors a pod spec could open around its slice (``webhook.admission.shimguard``,
``webhook.admission.grants``): hostPath to protected host directories, mounts over the shim's paths,
privileged GPU pods and high priority beyond what the namespace was granted.
"""

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from fracgpu import names
from fracgpu.dialects import DialectConfig
from fracgpu.errors import FracgpuError
from fracgpu.model import Assignment, ContainerRequest, Dialect, Priority, Reservation
from fracgpu.placement import ClusterView, NoFit, NoFitReason, Placement, PodDemand
from webhook.admission import assignments, ephemeral, grants, responses, shimguard, validate
from webhook.admission.mutate import canonical_resources, patch_for, queued_patch_for
from webhook.admission.review import AdmissionRequest
from webhook.metrics import Metrics
from webhook.queue import entry as queued
from webhook.queue.keys import SharedKey
from webhook.rules import pod as podlib
from webhook.rules import quota as quotalib
from webhook.rules.demand import PodAsk, gpu_container_names, read_ask
from webhook.rules.nodeaffinity import NodeIndexCache, allowed_nodes
from webhook.rules.podbounds import gpu_containers_problem
from webhook.rules.podbounds import problem as pod_problem
from webhook.rules.tolerations import (
    Taint,
    gpu_node_toleration,
    tolerates_key,
    untolerated_taints,
    with_toleration,
)
from webhook.settings import PlacementMode, Settings
from webhook.state.backend import (
    Claim,
    ForwardToLeader,
    NodeLabels,
    NodeTaints,
    RejectKind,
    ReserveRejected,
    StateBackend,
)

log = logging.getLogger(__name__)
# Sub-resources whose object is the pod and may carry containers (kubectl debug).
CHECKED_SUB_RESOURCES: Final = ("", "ephemeralcontainers")
MAX_NODES_NAMED: Final = 5


class ReservationIds:
    """Unguessable reservation IDs, ``r-`` and 16 hex digits from the OS's random source,
    drawn ``batch`` at a time: one system call per batch instead of one per pod."""

    def __init__(self, batch: int = 256) -> None:
        if batch < 1:
            raise ValueError(f"batch={batch}: use 1 or more")
        self._batch = batch
        self._ready: list[str] = []

    def __call__(self) -> str:
        if not self._ready:
            raw = secrets.token_bytes(8 * self._batch)
            self._ready = ["r-" + raw[i : i + 8].hex() for i in range(0, len(raw), 8)]
        return self._ready.pop()


class Admission:
    def __init__(
        self,
        settings: Settings,
        state: StateBackend,
        metrics: Metrics,
        new_id: Callable[[], str] | None = None,
        *,
        seal: SharedKey | None = None,
        clock: Callable[[], float] = time.time,
        held_nodes: Callable[[], frozenset[str]] | None = None,
    ) -> None:
        self._settings = settings
        self._state = state
        self._metrics = metrics
        self._new_id = new_id or ReservationIds()
        # Seals queued entries; replicas share it (derived from the serving key they share).
        self._seal = seal or SharedKey(None, "queued-entry")
        self._clock = clock
        self._queue_mode = settings.placement_mode is PlacementMode.QUEUE
        # Queue mode: nodes the head of the queue holds; a pod placed at admission keeps off
        # them too, or new small pods would take the room a large queued one waits for.
        self._held_nodes = held_nodes
        # Checked once: isinstance against a runtime Protocol is slow, and admission asks on
        # every pod.
        self._labels = state if isinstance(state, NodeLabels) else None
        self._taints = state if isinstance(state, NodeTaints) else None
        self._node_index = NodeIndexCache()
        # Written on every GPU pod when GPU nodes carry fracgpu's taint (gpu-node-taint).
        taint = settings.gpu_node_taint
        self._toleration = gpu_node_toleration(taint) if taint else None
        # The setting's directories and /proc, which reaches them: joined once, not per pod.
        self._protected_host_paths = shimguard.protected_host_paths(settings.protected_host_paths)

    # -- pods over a limit ---------------------------------------------------------------------
    def over_limit(self, request: AdmissionRequest) -> str | None:
        """Why admission will not read this review's pod (``podbounds``), checked first by
        ``mutate`` and ``validate``; fracgpu's own accounts are trusted with any pod."""
        if request.obj is None or request.username in self._settings.service_accounts:
            return None
        return pod_problem(request.obj, self._settings.pod_limits)

    async def refuse(self, request: AdmissionRequest, why: str) -> responses.Verdict:
        """The answer to a review whose pod is over a limit (``over_limit``, or a worker
        that read it, in which case ``request`` has no objects): denied where ``mutate`` and
        ``validate`` would read the pod, else allowed as they would (reading nothing)."""
        if (
            request.operation not in ("CREATE", "UPDATE")
            or not request.is_pod
            or request.sub_resource not in CHECKED_SUB_RESOURCES
        ):
            return responses.allowed()
        if not await self._state.namespace_managed(_namespace(request)):
            return responses.allowed()
        return responses.denied(why)

    # -- mutating ------------------------------------------------------------------------------
    async def mutate(
        self, request: AdmissionRequest, leaderless: bool = False
    ) -> responses.Verdict:
        """``leaderless`` (queue mode): no replica can place now (leadership is changing), so
        a GPU pod that could ever fit is queued, not refused; see ``_place``."""
        over = self.over_limit(request)  # before anything reads the pod
        if over:
            return await self.refuse(request, over)
        if ephemeral.is_ephemeral_update(request):
            return await self._ephemeral(request, ephemeral.mutate)
        if (
            request.operation != "CREATE"
            or not request.is_pod
            or request.sub_resource
            or request.obj is None
        ):
            return responses.allowed()
        pod = request.obj
        namespace = _namespace(request)
        if not await self._state.namespace_managed(namespace):
            return responses.allowed()
        trusted = request.username in self._settings.service_accounts
        try:
            if names.ANNOTATION_QUEUED in podlib.annotations(pod):
                return await self._requeue(pod, namespace, trusted)
            # The annotation first: most pods lack it, and then their containers are read once.
            if names.ANNOTATION_ASSIGNMENT in podlib.annotations(pod):
                gpu_containers = gpu_container_names(pod, self._settings.dialects)
                if gpu_containers:
                    return await self._reapply(
                        pod, namespace, gpu_containers, trusted, request.dry_run
                    )
            if not trusted:
                taken = validate.scheduler_finding(pod, self._settings.scheduler_name)
                if taken:
                    return responses.denied(taken)
            ask = read_ask(pod, self._settings.dialects, self._settings.policy)
            if ask.demand is None:
                return await self._mutate_without_gpu(pod, trusted, request.username)
            too_many = gpu_containers_problem(len(ask.requests), self._settings.pod_limits)
            if too_many and not trusted:
                return responses.denied(too_many)
            if not trusted:
                findings = validate.tamper_findings(
                    pod, placed_by_fracgpu=False, void_allowed=False
                )
                if findings:
                    return responses.denied(validate.tamper_message(findings, "this pod"))
                door = await self._open_door(
                    pod, namespace, [(r.container, r.priority) for r in ask.requests]
                )
                if door is not None:
                    return responses.denied(door)
            return await self._place(pod, namespace, ask, request, leaderless)
        except FracgpuError as error:
            return responses.invalid(str(error))

    async def _mutate_without_gpu(
        self, pod: Mapping[str, Any], trusted: bool, username: str
    ) -> responses.Verdict:
        if not trusted:
            findings = validate.tamper_findings(pod, placed_by_fracgpu=False, void_allowed=True)
            if findings:
                return responses.denied(validate.tamper_message(findings, "this pod"))
            door = await self._door_without_gpu(pod, username)
            if door is not None:
                return responses.denied(door)
        return responses.patched(patch_for(pod, None, self._settings.dialects))

    def _sealed(self, entry: queued.QueuedEntry, namespace: str, reservation_id: str) -> bool:
        """fracgpu wrote this entry for this namespace and reservation ID, within one
        admission window: a genuine entry copied onto another pod later is refused."""
        age_s = self._clock() - entry.queued_at_ms / 1000
        return age_s <= self._settings.admission_window_seconds and any(
            entry.seal_holds(k, namespace, reservation_id) for k in self._seal.accepted()
        )

    async def _requeue(
        self, pod: Mapping[str, Any], namespace: str, trusted: bool
    ) -> responses.Verdict:
        """Reinvocation of a queued pod: write the same entry again, queue nothing new."""
        raw = podlib.annotations(pod)
        try:
            entry = queued.decode(raw[names.ANNOTATION_QUEUED])
        except FracgpuError as error:
            return responses.denied(self._forged(pod, str(error)))
        reservation_id = raw.get(names.ANNOTATION_RESERVATION_ID, "")
        if not trusted and not self._sealed(entry, namespace, reservation_id):
            return responses.denied(
                self._forged(
                    pod,
                    f"{names.ANNOTATION_QUEUED} does not carry fracgpu's seal of the last "
                    f"{self._settings.admission_window_seconds:g} s",
                )
            )
        return responses.patched(
            queued_patch_for(
                pod,
                entry.charged_containers(),
                {},
                self._settings.scheduler_name,
                self._settings.dialects,
                toleration=self._toleration,
            )
        )

    async def _reapply(
        self,
        pod: Mapping[str, Any],
        namespace: str,
        gpu_containers: Sequence[str],
        trusted: bool,
        dry_run: bool,
    ) -> responses.Verdict:
        """Reinvocation: keep the pod's own verified assignment, write it again, place nothing."""
        assignment = await self._verified_assignment(
            pod, namespace, gpu_containers, trusted, dry_run
        )
        if isinstance(assignment, str):
            return responses.denied(assignment)
        return responses.patched(
            patch_for(pod, assignment, self._settings.dialects, toleration=self._toleration)
        )

    async def _place(
        self,
        pod: Mapping[str, Any],
        namespace: str,
        ask: PodAsk,
        request: AdmissionRequest,
        leaderless: bool = False,
    ) -> responses.Verdict:
        assert ask.demand is not None
        if not request.dry_run and not leaderless:
            await self._state.check_placing()  # else the leader replica places it
        demand = ask.demand
        quotas = await self._state.quotas(namespace)
        pools = quotalib.allowed_pools(quotas)
        pool_note = ""
        if pools is not None:
            demand = dataclasses.replace(
                demand, constraints=dataclasses.replace(demand.constraints, pools=pools)
            )
            allowed = ", ".join(pools) or "none (its GPUQuotas share no pool)"
            pool_note = f" (namespace {namespace}'s GPUQuota allows only pools {allowed})"
        view = await self._state.view()
        restricted = await self._restrict_to_allowed_nodes(pod, demand, view)
        if isinstance(restricted, str):
            self._metrics.placement_failure(NoFitReason.NEVER.value)
            return responses.denied(restricted)
        demand, narrowing = restricted
        quota_block: quotalib.QuotaExceeded | None = None
        if not request.dry_run:
            # Every arrival, placed or not, teaches the fragmentation policy the workload.
            view.observe(demand)
        for attempt in range(self._settings.placement_attempts):
            if attempt:  # a race was lost while reserving: read the state again
                view = await self._state.view()
                quotas = await self._state.quotas(namespace)
            placed = self._place_off_held(view, demand, ask)
            if leaderless and not (
                isinstance(placed, NoFit) and placed.reason is NoFitReason.NEVER
            ):
                # No leader holds GPUs now: queue it (its quota checked against this replica's
                # cache; the leader's recount confirms it before the pod is placed).
                nofit = placed if isinstance(placed, NoFit) else _LEADERLESS
                return await self._enqueue(
                    pod, namespace, ask, demand, view=view, request=request, nofit=nofit, hold=False
                )
            if isinstance(placed, NoFit):
                if quota_block is not None:  # the models left after quota exclusions are full
                    return self._quota_denial(quota_block)
                if placed.reason is NoFitReason.NOT_NOW and self._queue_mode:
                    return await self._enqueue(
                        pod, namespace, ask, demand, view=view, request=request, nofit=placed
                    )
                self._metrics.placement_failure(placed.reason.value)
                unit_note = _unit_note(placed, ask, self._settings.dialects)
                node_note = (
                    ""
                    if narrowing is None  # worded only here: placing never pays for it
                    else narrowing.note(
                        placed.reason, view.fitting_elsewhere(demand, placed.reason)
                    )
                )
                return responses.denied(placed.message + node_note + pool_note + unit_note)
            assignment = assignments.build(
                placed.node,
                self._new_id(),
                placed.containers,
                requests=demand.containers,
                view=view,
                disable_core_limit=self._settings.disable_core_limit,
            )
            chosen = view.inventory(placed.node)
            models = {d.uuid: d.model for d in chosen.devices} if chosen else {}
            over = quotalib.check(quotas, assignment.allocations(), models)
            if over is not None:
                if over.model and over.model not in demand.constraints.exclude_models:
                    # Per-model quota: another model may still fit within quota.
                    quota_block = quota_block or over
                    demand = _excluding_model(demand, over.model)
                    continue
                return self._quota_denial(quota_block or over)
            if not request.dry_run:
                try:
                    await self._state.reserve(
                        _claim(assignment, namespace, podlib.pod_name(pod), demand, models)
                    )
                except ReserveRejected as rejected:
                    if rejected.kind is RejectKind.QUOTA:
                        self._metrics.placement_failure("quota")
                        return responses.denied(rejected.message)
                    log.info("reservation lost a race, re-planning: %s", rejected.message)
                    continue
            return responses.patched(
                patch_for(pod, assignment, self._settings.dialects, toleration=self._toleration),
                _warnings(ask, assignment, self._settings.dialects),
            )
        if quota_block is not None:
            return self._quota_denial(quota_block)
        self._metrics.placement_failure("conflict")
        return responses.denied(
            f"the chosen GPUs were taken by other pods {self._settings.placement_attempts} "
            "times while this pod was being admitted: create it again",
            code=409,
            reason="Conflict",
        )

    def _place_off_held(
        self, view: ClusterView, demand: PodDemand, ask: PodAsk
    ) -> Placement | NoFit:
        """Placement at admission, off the nodes the queue's head holds (queue mode). A pod
        that fits only there waits in the queue behind the head (NOT_NOW)."""
        held = self._held_nodes() if self._held_nodes is not None else frozenset()
        if not held:
            return view.place(demand, ask.policy)
        everywhere = demand.constraints.nodes
        allowed = (everywhere if everywhere is not None else {n.name for n in view.nodes()}) - held
        off = dataclasses.replace(
            demand, constraints=dataclasses.replace(demand.constraints, nodes=frozenset(allowed))
        )
        placed = view.place(off, ask.policy)
        if isinstance(placed, NoFit):
            anywhere = view.place(demand, ask.policy)
            if not isinstance(anywhere, NoFit):
                return NoFit(
                    NoFitReason.NOT_NOW,
                    "the room that fits this pod is held for a pod ahead in the fracgpu queue",
                )
            return anywhere
        return placed

    async def _enqueue(
        self,
        pod: Mapping[str, Any],
        namespace: str,
        ask: PodAsk,
        demand: PodDemand,
        *,
        view: ClusterView,
        request: AdmissionRequest,
        nofit: NoFit,
        hold: bool = True,
    ) -> responses.Verdict:
        """Queue mode: the pod fits the cluster but not now. It is created with its quota
        charged (as ResourceQuota charges at admission) and waits for fracgpu's scheduler."""
        reservation_id = self._new_id()
        raw = podlib.annotations(pod)
        high = bool(
            grants.high_priority_asks(
                raw,
                [(r.container, r.priority) for r in ask.requests],
                self._settings.dialects.names.hami_priority,
            )
        )  # granted: _open_door refused ungranted asks before placement
        entry = queued.new_entry(
            demand,
            ask.policy,
            high_priority=high,
            pod_priority=_pod_priority(pod),
            queued_at_ms=int(self._clock() * 1000),
            charged_mib=queued.charged_memory(view, demand),
        ).sealed(self._seal.current(), namespace, reservation_id)
        charge = entry.charge()
        over = quotalib.check(await self._state.quotas(namespace), charge, {})
        if over is not None:
            return self._quota_denial(over)
        if hold and not request.dry_run:
            held = Reservation(reservation_id, "", namespace, podlib.pod_name(pod), charge, 0)
            try:
                await self._state.reserve(Claim(held, 0, 0, {}))
            except ReserveRejected as rejected:
                self._metrics.placement_failure("quota")
                return responses.denied(rejected.message)
        self._metrics.placement_failure("queued")
        annotations = {
            names.ANNOTATION_QUEUED: queued.encode(entry),
            names.ANNOTATION_RESERVATION_ID: reservation_id,
        }
        patch = queued_patch_for(
            pod,
            entry.charged_containers(),
            annotations,
            self._settings.scheduler_name,
            self._settings.dialects,
            toleration=self._toleration,
        )
        waiting = (
            f"queued: {nofit.message.split('. Controllers')[0]}. The pod is created and waits "
            f"Pending for scheduler {self._settings.scheduler_name}, which starts it when room "
            "frees (its quota is charged meanwhile)"
        )
        return responses.patched(patch, [waiting])

    async def _restrict_to_allowed_nodes(
        self, pod: Mapping[str, Any], demand: PodDemand, view: ClusterView
    ) -> tuple[PodDemand, "_Narrowing | None"] | str:
        """Keep placement on nodes the pod's nodeSelector / required affinity allow and whose
        taints it tolerates (when the back end knows labels / taints), by narrowing the GPUs
        it may use, and keep how, for a denial's words. The toleration fracgpu writes
        (gpu-node-taint) counts as the pod's."""
        allowed: set[str] | None = None
        if self._labels is not None:
            allowed = allowed_nodes(pod, await self._labels.node_labels(), self._node_index)
        selected = allowed
        kept_off: dict[str, list[Taint]] = {}
        if self._taints is not None:
            # Most nodes carry no taint: find the few excluded ones rather than the many allowed.
            tolerating = pod if self._toleration is None else with_toleration(pod, self._toleration)
            kept_off = untolerated_taints(tolerating, await self._taints.node_taints())
            if kept_off:
                everyone = {n.name for n in view.nodes()} if allowed is None else allowed
                allowed = everyone - kept_off.keys()
        if allowed is None or view.covers_all_nodes(allowed):
            return demand, None  # every GPU node is allowed: nothing to narrow
        wanted = frozenset(demand.constraints.include_uuids)
        usable = (
            any(d.uuid in wanted for n in view.nodes() if n.name in allowed for d in n.devices)
            if wanted
            else not allowed.isdisjoint(n.name for n in view.nodes())
        )
        if not usable:
            return (
                f"none of the {len(view.nodes())} GPU nodes matches this pod's nodeSelector, "
                "required node affinity and tolerations"
                + (" together with its GPU UUID annotation" if wanted else "")
                + f"{_taint_note(kept_off)}: fix the selector, add a toleration for the GPU "
                "nodes' taints, or label GPU nodes to match"
            )
        # Placement turns the node set into a mask once per distinct set (not per GPU per pod).
        nodes = frozenset(allowed)
        constraints = dataclasses.replace(demand.constraints, nodes=nodes)
        return dataclasses.replace(demand, constraints=constraints), _Narrowing(
            nodes, selected, kept_off
        )

    def _quota_denial(self, over: quotalib.QuotaExceeded) -> responses.Verdict:
        self._metrics.placement_failure("quota")
        return responses.denied(over.message)

    # -- validating ----------------------------------------------------------------------------
    async def validate(self, request: AdmissionRequest) -> responses.Verdict:
        over = self.over_limit(request)  # before anything reads the pod
        if over:
            return await self.refuse(request, over)
        if ephemeral.is_ephemeral_update(request):
            if request.username in self._settings.service_accounts:
                return responses.allowed()
            verdict = await self._ephemeral(request, ephemeral.validate_update)
            if not verdict.allowed:
                return verdict
            verdict = await self._ephemeral(request, self._debug_mounts)
            if not verdict.allowed:
                return verdict
            return await self._debug_privileges(request)
        if (
            request.operation not in ("CREATE", "UPDATE")
            or not request.is_pod
            or request.sub_resource not in CHECKED_SUB_RESOURCES
            or request.obj is None
        ):
            return responses.allowed()
        namespace = _namespace(request)
        if not await self._state.namespace_managed(namespace):
            return responses.allowed()
        pod = request.obj
        if request.username in self._settings.service_accounts:
            await self._confirm_trusted(request, pod)
            return responses.allowed()
        try:
            if request.operation == "UPDATE":
                return await self._validate_update(namespace, request.old_obj, pod)
            taken = validate.scheduler_finding(pod, self._settings.scheduler_name)
            gpu_containers = gpu_container_names(pod, self._settings.dialects)
            if gpu_containers and names.ANNOTATION_QUEUED in podlib.annotations(pod):
                return await self._validate_queued(pod, namespace, gpu_containers, request.dry_run)
            if taken:
                return responses.denied(taken)
            if not gpu_containers or names.ANNOTATION_ASSIGNMENT not in podlib.annotations(pod):
                ask = read_ask(pod, self._settings.dialects, self._settings.policy)
                if ask.demand is not None:
                    return responses.denied(
                        "this pod asks for GPUs but carries no fracgpu assignment: the fracgpu "
                        "mutating webhook did not place it. Check that the "
                        "MutatingWebhookConfiguration selects this namespace, then create it "
                        "again"
                    )
                findings = validate.tamper_findings(pod, placed_by_fracgpu=False, void_allowed=True)
                if findings:
                    return responses.denied(validate.tamper_message(findings, "this pod"))
                door = await self._door_without_gpu(pod, request.username)
                return responses.allowed() if door is None else responses.denied(door)
            assignment = await self._verified_assignment(
                pod, namespace, gpu_containers, False, request.dry_run
            )
            if isinstance(assignment, str):
                return responses.denied(assignment)
            door = await self._open_door(
                pod, namespace, [(c.container, c.priority) for c in assignment.containers]
            )
            if door is not None:
                return responses.denied(door)
            drift = validate.drift_findings(
                pod, assignment, self._settings.dialects, toleration=self._toleration
            )
            if drift:
                return responses.denied(
                    "this pod differs from what fracgpu wrote for its assignment at "
                    f"{', '.join(drift[: validate.MAX_FINDINGS_SHOWN])}: something changed "
                    "fracgpu's fields after it placed the pod, or added containers it did not "
                    "see (fracgpu's MutatingWebhookConfiguration needs reinvocationPolicy: "
                    "IfNeeded when other webhooks inject containers)"
                )
            if request.operation == "CREATE" and not request.dry_run:
                # Past every mutating webhook: the reservation stays while the pod is stored.
                await self._state.confirm(assignment.reservation_id, podlib.pod_name(pod))
            return responses.allowed()
        except FracgpuError as error:
            return responses.invalid(str(error))

    async def _validate_queued(
        self, pod: Mapping[str, Any], namespace: str, gpu_containers: Sequence[str], dry_run: bool
    ) -> responses.Verdict:
        """A queued pod (CREATE) must carry exactly what fracgpu's mutation wrote: its sealed
        entry, the reservation ID it was sealed with, the fracgpu scheduler and the canonical
        resources of its charge, and nothing else of fracgpu's."""
        raw = podlib.annotations(pod)
        forged = validate.tamper_findings(pod, placed_by_fracgpu=False, void_allowed=True)
        reservation_id = raw.get(names.ANNOTATION_RESERVATION_ID, "")
        try:
            entry = queued.decode(raw[names.ANNOTATION_QUEUED])
        except FracgpuError as error:
            return responses.denied(self._forged(pod, str(error)))
        if not self._sealed(entry, namespace, reservation_id):
            return responses.denied(
                self._forged(
                    pod,
                    f"{names.ANNOTATION_QUEUED} does not carry fracgpu's seal of the last "
                    f"{self._settings.admission_window_seconds:g} s",
                )
            )
        if sorted(r.container for r in entry.requests) != sorted(gpu_containers):
            return responses.denied(
                self._forged(pod, "the queued entry does not cover exactly the GPU containers")
            )
        left = [f for f in forged if f not in _QUEUED_WRITTEN]
        if left:
            return responses.denied(validate.tamper_message(left, "this pod"))
        drift = queued_patch_for(
            pod,
            entry.charged_containers(),
            {names.ANNOTATION_QUEUED: raw[names.ANNOTATION_QUEUED]},
            self._settings.scheduler_name,
            self._settings.dialects,
            toleration=self._toleration,
        )
        if drift:
            shown = ", ".join(f"{op['op']} {op['path']}" for op in drift[:8])
            return responses.denied(
                f"this queued pod differs from what fracgpu wrote at {shown}: something changed "
                "fracgpu's fields after it queued the pod"
            )
        door = await self._open_door(
            pod, namespace, [(r.container, r.priority) for r in entry.requests]
        )
        if door is not None:
            return responses.denied(door)
        if not dry_run:
            # Only the leader holds queued charges to confirm; elsewhere the pod carries its
            # charge once stored, so a queued pod never waits for a leader here.
            with contextlib.suppress(ForwardToLeader):
                await self._state.confirm(reservation_id, podlib.pod_name(pod))
        return responses.allowed()

    async def _confirm_trusted(self, request: AdmissionRequest, pod: Mapping[str, Any]) -> None:
        """A pod fracgpu's own accounts create skips validation, but a reservation made for
        it must still be confirmed (else it would be given back as refused)."""
        if request.operation != "CREATE" or request.dry_run:
            return
        try:
            raw = podlib.annotations(pod)
        except FracgpuError:
            return
        if names.ANNOTATION_ASSIGNMENT in raw:
            assignment = validate.read_assignment(raw)
            if not isinstance(assignment, str):
                await self._state.confirm(assignment.reservation_id, podlib.pod_name(pod))

    async def _ephemeral(
        self,
        request: AdmissionRequest,
        check: Callable[[AdmissionRequest], responses.Verdict],
    ) -> responses.Verdict:
        """Debug containers added to a running pod in a managed namespace."""
        if not await self._state.namespace_managed(_namespace(request)):
            return responses.allowed()
        try:
            return check(request)
        except FracgpuError as error:
            return responses.invalid(str(error))

    async def _validate_update(
        self, namespace: str, old: Mapping[str, Any] | None, new: Mapping[str, Any]
    ) -> responses.Verdict:
        if old is None:
            return responses.invalid("an UPDATE review must carry oldObject")
        findings = validate.update_findings(old, new)
        taken = validate.scheduler_finding(new, self._settings.scheduler_name)
        if taken and validate.scheduler_finding(old, self._settings.scheduler_name) != taken:
            return responses.denied(taken)
        if findings:
            return responses.denied(validate.tamper_message(findings, "this update"))
        door = self._tolerations_added_door(old, new)
        if door is not None:
            return responses.denied(door)
        before, after = podlib.annotations(old), podlib.annotations(new)
        # A container that restarts is created with the pod's annotations as they are then.
        had = set(shimguard.device_injection_findings(before))
        injected = [f for f in shimguard.device_injection_findings(after) if f not in had]
        if injected:
            return responses.denied(shimguard.device_injection_denial(injected))
        if grants.priority_changed(before, after):
            # The agent reads the pod's priority when a container (re)starts.
            asks = grants.high_priority_asks(after, (), self._settings.dialects.names.hami_priority)
            denial = grants.priority_denial(namespace, await self._state.quotas(namespace), asks)
            if denial is not None:
                return responses.denied(denial)
        return responses.allowed()

    # -- doors a pod spec could open around the slice ------------------------------------------
    async def _open_door(
        self,
        pod: Mapping[str, Any],
        namespace: str,
        priorities: Sequence[tuple[str, Priority | None]],
    ) -> str | None:
        """Why a GPU pod is denied for reaching around its slice, or None: hostPath to
        protected host directories, mounts over the shim's paths, privileges or a priority
        above what the namespace was granted."""
        door = self._node_reach_door(pod)
        if door is not None:
            return door
        mounts, privileged = shimguard.container_findings(
            pod, lambda name: any(name == gpu for gpu, _ in priorities)
        )
        if mounts:
            return shimguard.mount_denial(mounts)
        # Read in place (not copied): the tamper check before this read every value.
        raw = podlib.mapping_at(podlib.metadata(pod), "annotations", ".metadata")
        asks = grants.high_priority_asks(
            raw, priorities, self._settings.dialects.names.hami_priority
        )
        if not privileged and not asks:
            return None  # most pods: no GPUQuota to read
        quotas = await self._state.quotas(namespace)
        return grants.privileged_denial(namespace, quotas, privileged) or grants.priority_denial(
            namespace, quotas, asks
        )

    def _debug_mounts(self, request: AdmissionRequest) -> responses.Verdict:
        """A debug container may mount the pod's volumes its own way: one mounting a host
        directory that only read-only mounts let the pod have (/sys) writable is refused, and
        so is one mounting a GPU container's region volume (it could write that container's
        accounting). An EphemeralContainers object (Kubernetes 1.20, 1.21) carries no volumes
        to check, but its containers' mounts name them."""
        assert request.obj is not None
        added = ephemeral.added_containers(request.obj, request.old_obj)
        regions = shimguard.region_volume_findings(added, podlib.EPHEMERAL_CONTAINERS)
        if regions:
            return responses.denied(shimguard.debug_region_denial(regions))
        door = self._host_path_door(request.obj) if request.is_pod else None
        return responses.allowed() if door is None else responses.denied(door)

    async def _debug_privileges(self, request: AdmissionRequest) -> responses.Verdict:
        """Privileged debug containers added to a GPU pod need the namespace's grant. An
        EphemeralContainers object (Kubernetes 1.20, 1.21) does not say whether the pod holds
        GPUs: it is checked as if it did."""
        assert request.obj is not None
        namespace = _namespace(request)
        if not await self._state.namespace_managed(namespace):
            return responses.allowed()
        try:
            if request.is_pod and not gpu_container_names(request.obj, self._settings.dialects):
                return responses.allowed()
            added = ephemeral.added_containers(request.obj, request.old_obj)
            findings = shimguard.container_privileges(added, podlib.EPHEMERAL_CONTAINERS)
        except FracgpuError as error:
            return responses.invalid(str(error))
        if not findings:
            return responses.allowed()
        denial = grants.privileged_denial(namespace, await self._state.quotas(namespace), findings)
        return responses.allowed() if denial is None else responses.denied(denial)

    async def _door_without_gpu(self, pod: Mapping[str, Any], username: str) -> str | None:
        """What refuses an untrusted pod without GPUs, at mutation and at validation alike."""
        return (
            self._node_reach_door(pod)
            or self._gpu_node_taint_door(pod)
            or await self._gpu_node_name_door(pod, username)
        )

    async def _gpu_node_name_door(self, pod: Mapping[str, Any], username: str) -> str | None:
        """A pod without GPUs may not name a GPU node in ``spec.nodeName`` (gpu-node-taint):
        such a pod skips the scheduler, and kubelet checks only NoExecute taints, so the
        NoSchedule taint would not keep it off. A GPU node is one in the placement view, or
        one the back end knows to carry the taint (a cordoned GPU node is not in the view).
        Only pods that set ``nodeName`` cost a look-up; the view is the one placement reads."""
        key = self._settings.gpu_node_taint
        if not key:
            return None
        node = podlib.spec(pod).get("nodeName")
        if not isinstance(node, str) or not node or username == f"system:node:{node}":
            # unset, or the node's own kubelet (the mirror pod of one of its static pods)
            return None
        known = (await self._state.view()).inventory(node) is not None
        if not known and self._taints is not None:
            taints = (await self._taints.node_taints()).get(node, ())
            known = any(t.key == key for t in taints)
        if not known:
            return None
        return (
            f"this pod asks for no GPU but sets spec.nodeName to GPU node {node!r}: a pod bound "
            f"by nodeName skips the scheduler and the taint {key!r} that keeps GPU nodes for GPU "
            "pods (fracgpu setting gpu-node-taint), so fracgpu refuses it. Remove spec.nodeName "
            "and let the scheduler place the pod on a node without GPUs"
        )

    def _tolerations_added_door(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
        """Tolerations may be added to an existing pod (Kubernetes allows it, e.g. to a pod
        held by a scheduling gate): the gpu-node-taint rule holds on UPDATE too, for a pod
        without GPUs whose update makes it tolerate the taint. A pod that tolerated it
        already (admitted before the setting) is left as it was."""
        key = self._settings.gpu_node_taint
        if not key:
            return None
        before = podlib.spec(old).get("tolerations")
        if podlib.spec(new).get("tolerations") == before:
            return None  # most updates: nothing to read
        if gpu_container_names(new, self._settings.dialects) or tolerates_key(old, key):
            return None
        return self._gpu_node_taint_door(new)

    def _gpu_node_taint_door(self, pod: Mapping[str, Any]) -> str | None:
        """A pod without GPUs may not tolerate the GPU nodes' taint (gpu-node-taint): it
        would take the CPU and memory that GPU pods and whole-node jobs need there."""
        key = self._settings.gpu_node_taint
        if not key or not tolerates_key(pod, key):
            return None
        return (
            f"this pod asks for no GPU but tolerates the taint {key!r}, which keeps GPU nodes "
            "for GPU pods (fracgpu setting gpu-node-taint): remove that toleration (one with "
            "operator Exists and no key tolerates every taint, this one too)"
        )

    def _node_reach_door(self, pod: Mapping[str, Any]) -> str | None:
        """Reaches past the node's devices and files for any pod, GPU or not: hostPath to
        protected host directories (and to /proc and /sys, which reach them), annotations
        that have the runtime inject devices."""
        door = self._host_path_door(pod)
        if door is not None:
            return door
        raw = podlib.mapping_at(podlib.metadata(pod), "annotations", ".metadata")
        injected = shimguard.device_injection_findings(raw) if raw else []
        return shimguard.device_injection_denial(injected) if injected else None

    def _host_path_door(self, pod: Mapping[str, Any]) -> str | None:
        """hostPath to protected host directories, or writable inside /sys."""
        findings = shimguard.host_path_findings(pod, self._protected_host_paths)
        if not findings:
            return None
        return shimguard.host_path_denial(findings, self._protected_host_paths)

    # -- shared --------------------------------------------------------------------------------
    async def _verified_assignment(
        self,
        pod: Mapping[str, Any],
        namespace: str,
        gpu_containers: Sequence[str],
        trusted: bool,
        dry_run: bool,
    ) -> Assignment | str:
        """The pod's assignment if fracgpu made it (or a trusted account wrote it), else why not."""
        assignment = validate.read_assignment(podlib.annotations(pod))
        if isinstance(assignment, str):
            return self._forged(pod, assignment)
        reservation = (
            None
            if dry_run
            else await self._state.reservation(assignment.reservation_id, assignment.node)
        )
        findings = validate.assignment_findings(
            assignment,
            gpu_containers,
            namespace,
            reservation,
            check_reservation=not (dry_run or trusted),
            presenting=podlib.pod_name(pod),
        )
        if not trusted:
            findings += assignments.findings(
                assignment, await self._state.view(), self._settings.disable_core_limit
            )
        if findings:
            return self._forged(pod, "; ".join(findings))
        if not trusted:
            extra = validate.tamper_findings(pod, placed_by_fracgpu=True, void_allowed=True)
            if extra:
                return validate.tamper_message(extra, "this pod")
        return assignment

    def _forged(self, pod: Mapping[str, Any], why: str) -> str:
        """A pod whose fracgpu fields fracgpu did not write: name them all, and why."""
        findings = validate.tamper_findings(pod, placed_by_fracgpu=False, void_allowed=True)
        return f"{validate.tamper_message(findings, 'this pod')} (not fracgpu's because {why})"


def _claim(
    assignment: Assignment,
    namespace: str,
    pod_name: str,
    demand: PodDemand,
    models: Mapping[str, str],
) -> Claim:
    """What to reserve for a placement; the back end sets the expiry."""
    reservation = Reservation(
        id=assignment.reservation_id,
        node=assignment.node,
        namespace=namespace,
        pod=pod_name,
        allocations=assignment.allocations(),
        expires_at=0,
    )
    return Claim(reservation, demand.cpu_milli, demand.memory_mib, models)


_LEADERLESS: Final = NoFit(
    NoFitReason.NOT_NOW, "no replica places GPU pods while leadership is changing"
)
# What fracgpu writes on a queued pod (tamper findings that validation expects there).
_QUEUED_WRITTEN: Final = frozenset(
    {f"annotation {names.ANNOTATION_QUEUED}", f"annotation {names.ANNOTATION_RESERVATION_ID}"}
)


def _pod_priority(pod: Mapping[str, Any]) -> int:
    """spec.priority as the API server's Priority admission set it from the PriorityClass."""
    value = podlib.spec(pod).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _namespace(request: AdmissionRequest) -> str:
    meta = request.obj.get("metadata") if request.obj else None
    from_pod = meta.get("namespace") if isinstance(meta, dict) else None
    return request.namespace or (from_pod if isinstance(from_pod, str) else "") or "default"


def _excluding_model(demand: PodDemand, model: str) -> PodDemand:
    constraints = demand.constraints
    return dataclasses.replace(
        demand,
        constraints=dataclasses.replace(
            constraints, exclude_models=(*constraints.exclude_models, model)
        ),
    )


def _unit_note(nofit: NoFit, ask: PodAsk, dialects: DialectConfig) -> str:
    """For a pod that can never fit: the unit its gpushare memory was read in, a figure
    often meant in MiB where the cluster reads GiB (or the other way round)."""
    if nofit.reason is not NoFitReason.NEVER or not any(
        r.dialect is Dialect.GPUSHARE for r in ask.requests
    ):
        return ""
    unit = "GiB" if dialects.gpushare_memory_unit_mib == 1024 else "MiB"
    return (
        f" ({dialects.names.gpushare_mem} is read in {unit} here: webhook setting "
        "gpushare-memory-unit)"
    )


def _warnings(ask: PodAsk, assignment: Assignment, dialects: DialectConfig) -> list[str]:
    """Tell the user what their dialect became, and when compute is best effort."""
    warnings = []
    for request in ask.requests:
        held = assignment.for_container(request.container)
        if held is None:
            continue
        if request.dialect is not Dialect.TKESTACK:
            canonical = ", ".join(
                f"{k}={v}" for k, v in sorted(canonical_resources(held, dialects).items())
            )
            warnings.append(
                f'container "{request.container}": {request.dialect.value} request '
                f"normalised to {canonical}"
            )
        if _best_effort(request):
            warnings.append(
                f'container "{request.container}" reserves no GPU compute (best effort): '
                "set a core share to guarantee one"
            )
    return warnings


def _best_effort(request: ContainerRequest) -> bool:
    return request.cores == 0


@dataclasses.dataclass(frozen=True)
class _Narrowing:
    """How a pod's nodeSelector, required node affinity and tolerations narrowed the nodes
    it may use: ``allowed`` what is left, ``selected`` what the selector and affinity allow
    (None: every node), ``kept_off`` the taints it does not tolerate, per node."""

    allowed: frozenset[str]
    selected: set[str] | None
    kept_off: Mapping[str, Sequence[Taint]]

    def note(self, reason: NoFitReason, fitting: Sequence[str]) -> str:
        """For a denial: which of the nodes the pod is kept off could hold it (``fitting``:
        now for NOT_NOW, if empty for NEVER) and what keeps it off them. Nothing when none
        could: then the narrowing made no difference, and naming it misleads."""
        if not fitting:
            return ""
        shown = sorted(self.allowed)[:MAX_NODES_NAMED]
        more = " and more" if len(self.allowed) > len(shown) else ""
        selected = self.selected
        outside = [n for n in fitting if selected is not None and n not in selected]
        unselected = (
            f"; not matching its nodeSelector or node affinity: {_few(outside)}" if outside else ""
        )
        taints = _taint_note({n: self.kept_off[n] for n in fitting if n in self.kept_off})
        could = "could hold it" if reason is NoFitReason.NEVER else "have room for it"
        return (
            f"; nodes it is kept off {could} (its nodeSelector, required node affinity and "
            f"tolerations allow only {', '.join(shown)}{more}{unselected}{taints})"
        )


def _taint_note(kept_off: Mapping[str, Sequence[Taint]]) -> str:
    """The taints that keep the pod off GPU nodes (the first few nodes), for a denial."""
    nodes = sorted(kept_off)
    parts = [
        f"{node} has taint "
        + ", ".join(f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}" for t in kept_off[node])
        for node in nodes[:MAX_NODES_NAMED]
    ]
    if not parts:
        return ""
    more = len(nodes) - len(parts)
    return f"; not tolerated: {'; '.join(parts)}" + (f" and {more} more nodes" if more else "")


def _few(nodes: Sequence[str]) -> str:
    """The first few of ``nodes`` by name, and how many more."""
    more = len(nodes) - MAX_NODES_NAMED
    return ", ".join(nodes[:MAX_NODES_NAMED]) + (f" and {more} more nodes" if more > 0 else "")
