"""The embedded back end: cluster state from a cluster file (``webhook.state.clusterfile``), in
memory.

Quota use is counted from the file's pods (as the recount controller does), not read from
the file. Reservations made by admission stay until released: there is no pod watch here,
so a pod fracgpu's validating webhook confirmed is assumed to exist. One that validation
never confirmed within the admission window (``admission_window_s``) was refused by a later
admission step before validation, and is given back at the next admission.
"""

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from fracgpu import names
from fracgpu.model import GPUAllocation, Quota, Reservation, ResourceAmounts
from fracgpu.placement import ClusterView
from fracgpu.placement.fragmentation import HELD_WHOLE_NODES
from webhook.rules import quota as quotalib
from webhook.rules.tolerations import Taint
from webhook.state.backend import Claim, RejectKind, ReserveRejected
from webhook.state.clusterfile import ClusterFile, load_cluster_file
from webhook.state.reservecheck import reserve_problem


class EmbeddedState:
    """``StateBackend`` over a parsed cluster file; one asyncio lock makes reserve atomic."""

    def __init__(
        self,
        cluster: ClusterFile,
        split_count: int,
        reservation_ttl_seconds: int,
        clock: Callable[[], float] = time.time,
        *,
        memory_scaling: float = 1.0,
        admission_window_s: float | None = None,
        held_whole_nodes: int = HELD_WHOLE_NODES,
    ) -> None:
        self._view = ClusterView(
            cluster.nodes,
            default_split_count=split_count,
            default_memory_scaling=memory_scaling,
            held_whole_nodes=held_whole_nodes,
        )
        self._split_count = split_count
        self._ttl = reservation_ttl_seconds
        self._clock = clock
        self._lock = asyncio.Lock()
        self._nodes = {n.name: n for n in cluster.nodes}
        self._models = {d.uuid: d.model for n in cluster.nodes for d in n.devices}
        self._namespaces = cluster.namespace_labels
        self._node_labels = cluster.node_labels
        self._node_taints = {node: t for node, t in cluster.node_taints.items() if t}
        self._reservations: dict[str, Claim] = {}
        # Reservation ID -> when it was made, until validation confirms it (None: never given
        # back, for tools that only mutate).
        self._window = admission_window_s
        self._unconfirmed: dict[str, float] = {}
        quotas = [replace(q, used=ResourceAmounts(), used_by_model={}) for q in cluster.quotas]
        for pod in cluster.pods:
            self._take(pod.node, pod.allocations, pod.cpu_milli, pod.memory_mib)
            quotas = [
                quotalib.charge(q, pod.allocations, self._models)
                if q.namespace == pod.namespace
                else q
                for q in quotas
            ]
        self._quotas = quotas

    @classmethod
    def from_file(
        cls,
        path: Path,
        split_count: int,
        reservation_ttl_seconds: int,
        memory_scaling: float = 1.0,
        *,
        admission_window_s: float | None = None,
        held_whole_nodes: int = HELD_WHOLE_NODES,
    ) -> "EmbeddedState":
        return cls(
            load_cluster_file(path),
            split_count,
            reservation_ttl_seconds,
            memory_scaling=memory_scaling,
            admission_window_s=admission_window_s,
            held_whole_nodes=held_whole_nodes,
        )

    def ready(self) -> bool:
        return True

    async def view(self) -> ClusterView:
        if self._unconfirmed:
            self._release_refused()
        return self._view

    async def node_labels(self) -> Mapping[str, Mapping[str, str]]:
        return self._node_labels

    async def node_taints(self) -> Mapping[str, tuple[Taint, ...]]:
        return self._node_taints

    async def namespace_managed(self, namespace: str) -> bool:
        labels = self._namespaces.get(namespace, {})
        return labels.get(names.NAMESPACE_LABEL_OPT_OUT, "").lower() != "true"

    async def quotas(self, namespace: str) -> tuple[Quota, ...]:
        if self._unconfirmed:
            self._release_refused()
        return tuple(q for q in self._quotas if q.namespace == namespace)

    def all_quotas(self) -> tuple[Quota, ...]:
        return tuple(self._quotas)

    async def reservation(self, reservation_id: str, node: str = "") -> Reservation | None:
        del node  # one process: nothing can lag behind
        claim = self._reservations.get(reservation_id)
        return None if claim is None else claim.reservation

    def reservations(self) -> tuple[Reservation, ...]:
        return tuple(c.reservation for c in self._reservations.values())

    def models(self) -> Mapping[str, str]:
        return dict(self._models)

    def placing(self) -> bool:
        return True

    async def check_placing(self) -> None:
        """One process holds the whole state: it always places."""

    async def reserve(self, claim: Claim) -> None:
        async with self._lock:
            held = claim.reservation
            if held.id in self._reservations:
                raise ReserveRejected(RejectKind.CAPACITY, f"reservation {held.id} exists already")
            namespace_quotas = [q for q in self._quotas if q.namespace == held.namespace]
            rejected = reserve_problem(
                self._view, claim, namespace_quotas, self._models, split_count=self._split_count
            )
            if rejected is not None:
                raise rejected
            if held.node:
                self._take(held.node, held.allocations, claim.cpu_milli, claim.memory_mib)
            self._charge(held.namespace, held.allocations, sign=1)
            self._charge(held.namespace, claim.replaces, sign=-1)
            # Built directly: dataclasses.replace inspects the fields on every call.
            expiring = Reservation(
                id=held.id,
                node=held.node,
                namespace=held.namespace,
                pod=held.pod,
                allocations=held.allocations,
                expires_at=int(self._clock()) + self._ttl,
            )
            self._reservations[held.id] = Claim(
                expiring,
                cpu_milli=claim.cpu_milli,
                memory_mib=claim.memory_mib,
                models=claim.models,
                replaces=claim.replaces,
            )
            if self._window is not None:
                self._unconfirmed[held.id] = self._clock()

    async def release(self, reservation_id: str) -> None:
        async with self._lock:
            self._release(reservation_id)

    async def confirm(self, reservation_id: str, pod: str) -> None:
        del pod  # no pod watch to look it up in: a confirmed pod is assumed to be stored
        self._unconfirmed.pop(reservation_id, None)

    def unconfirmed(self) -> int:
        """Reservations waiting for validation (metrics, tests)."""
        return len(self._unconfirmed)

    def _release_refused(self) -> None:
        """Give back reservations that validation did not confirm within the window. Sync:
        nothing else runs between the check and the release (asyncio)."""
        assert self._window is not None
        due = self._clock() - self._window
        for reservation_id, since in list(self._unconfirmed.items()):
            if since <= due:
                self._release(reservation_id)

    def _release(self, reservation_id: str) -> None:
        self._unconfirmed.pop(reservation_id, None)
        claim = self._reservations.pop(reservation_id, None)
        if claim is None:
            return
        held = claim.reservation
        if held.node:
            self._view.release(held.node, held.allocations, claim.cpu_milli, claim.memory_mib)
        self._charge(held.namespace, held.allocations, sign=-1)
        self._charge(held.namespace, claim.replaces, sign=1)

    # -- internals ---------------------------------------------------------------------------
    def _take(
        self, node: str, allocations: tuple[GPUAllocation, ...], cpu: int, memory: int
    ) -> None:
        self._view.allocate(node, allocations, cpu, memory)

    def _charge(self, namespace: str, allocations: tuple[GPUAllocation, ...], sign: int) -> None:
        self._quotas = [
            quotalib.charge(q, allocations, self._models, sign) if q.namespace == namespace else q
            for q in self._quotas
        ]
