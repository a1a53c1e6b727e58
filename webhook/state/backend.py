"""The cluster state admission needs, as one small interface with two back ends.

- ``webhook.state.embedded.EmbeddedState``: a YAML/JSON file (demo, ``fracgpu admit``, tests);
- the Kubernetes back end (watch caches; the leader replica places, holds reservations and
  quota charges in memory and writes them behind to GPUNode and GPUQuota status).

Admission plans against ``view()`` without holding anything, then calls ``reserve``, which
must re-check capacity and quota atomically and raise ``ReserveRejected`` when the plan lost
a race; admission re-plans a bounded number of times.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from fracgpu.model import GPUAllocation, Quota, Reservation
from fracgpu.placement import ClusterView
from webhook.rules.tolerations import Taint


class RejectKind(StrEnum):
    CAPACITY = "capacity"  # a GPU or the node no longer has room: re-plan
    QUOTA = "quota"  # the namespace's GPUQuota no longer has room: deny


class ReserveRejected(Exception):  # noqa: N818 - named for what happened; cluster mode uses it
    def __init__(self, kind: RejectKind, message: str) -> None:
        self.kind = kind
        self.message = message
        super().__init__(f"{kind}: {message}")


class StateUnavailable(Exception):  # noqa: N818 - a condition, not a bug
    """The back end cannot answer now (caches not synced, API unreachable): fail closed."""


class ForwardToLeader(Exception):  # noqa: N818 - a condition, not a bug
    """Another replica places pods (cluster mode): send this review to ``leader_url``, or
    fail closed with ``reason`` when no leader can take it now."""

    def __init__(self, leader_url: str, reason: str) -> None:
        self.leader_url = leader_url
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class Claim:
    """What ``reserve`` records: the reservation plus what it charges besides GPUs."""

    reservation: Reservation
    cpu_milli: int
    memory_mib: int
    # GPU UUID -> model, for per-model quota.
    models: Mapping[str, str] = field(default_factory=dict)
    # The queued charge this claim takes the place of (queue mode: the pod is being placed),
    # given back when the claim is charged. A claim on node "" holds no GPU: it is the
    # quota charge of a queued pod.
    replaces: tuple[GPUAllocation, ...] = ()
    # Charges left out of this claim's quota check only (queue mode: the queued pods behind
    # it in its namespace, which are let in to quota after it).
    behind: tuple[GPUAllocation, ...] = ()


class StateBackend(Protocol):
    def ready(self) -> bool:
        """Whether the state is complete enough to admit pods (``/readyz``)."""
        ...

    async def view(self) -> ClusterView:
        """Free capacity now, admitted pods and live reservations counted. Callers only read."""
        ...

    async def namespace_managed(self, namespace: str) -> bool:
        """False when the namespace opted out (label ``fracgpu.io/ignore=true``)."""
        ...

    async def quotas(self, namespace: str) -> tuple[Quota, ...]:
        """The namespace's GPUQuotas with their current use."""
        ...

    async def reservation(self, reservation_id: str, node: str = "") -> Reservation | None:
        """A live reservation this webhook made, or None (unknown or expired).

        ``node`` is where the pod's assignment says it is: a back end whose cache may lag
        behind another replica's write reads that node's reservations fresh on a miss.
        """
        ...

    def placing(self) -> bool:
        """Whether this process places GPU pods now (cluster mode: only the leader, once
        its takeover wait is over); exported as a metric."""
        ...

    async def check_placing(self) -> None:
        """Return when this process may place pods; raise ``ForwardToLeader`` where another
        replica does (cluster mode: only the leader places)."""
        ...

    async def reserve(self, claim: Claim) -> None:
        """Hold the claim's GPUs, CPU, memory and quota atomically, or raise ReserveRejected."""
        ...

    async def release(self, reservation_id: str) -> None:
        """Give a reservation back (unknown IDs are ignored)."""
        ...

    async def confirm(self, reservation_id: str, pod: str) -> None:
        """fracgpu's validating webhook verified this reservation's pod (``pod``: its final
        name; validation runs after every mutating webhook and after the API server named a
        generateName pod). A reservation unconfirmed one admission window after it was made,
        or confirmed but whose pod is not stored one window after that, is given back: a
        later admission step refused the pod (a later mutating webhook, the API server's own
        validation, another validating webhook, ResourceQuota)."""
        ...


@runtime_checkable
class NodeLabels(Protocol):
    """Optional: a back end that knows node labels lets placement honour the pod's own
    nodeSelector and required node affinity (admission checks ``isinstance``)."""

    async def node_labels(self) -> Mapping[str, Mapping[str, str]]:
        """Labels of every GPU node, by node name."""
        ...


@runtime_checkable
class NodeTaints(Protocol):
    """Optional: a back end that knows node taints keeps placement off nodes whose
    NoSchedule/NoExecute taints the pod does not tolerate."""

    async def node_taints(self) -> Mapping[str, tuple[Taint, ...]]:
        """Taints of the GPU nodes that have any, by node name (untainted nodes left out:
        admission reads this on every pod, and most nodes carry no taint)."""
        ...


@runtime_checkable
class QuotaListing(Protocol):
    """Optional: a back end that lists every GPUQuota lets the webhook export quota limits
    and use as metrics (the server checks ``isinstance``)."""

    def all_quotas(self) -> tuple[Quota, ...]:
        """Every GPUQuota with its current use, read without waiting (at scrape time)."""
        ...


@dataclass(frozen=True)
class DriftCounts:
    """What a back end's self-check found: checks run, repairs since start and items found
    drifted by the last check, by kind of drift."""

    checks: int
    repairs: Mapping[str, int]
    drifted: Mapping[str, int]


@runtime_checkable
class SelfChecked(Protocol):
    """Optional: a back end that checks its own bookkeeping against a recount exports what
    it found as metrics (the server checks ``isinstance``)."""

    def drift_counts(self) -> DriftCounts:
        """The self-check's counts now, read without waiting (at scrape time)."""
        ...
