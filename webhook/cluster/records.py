"""Small immutable records the watch caches keep instead of whole API objects.

Keeping a few fields per object bounds the webhook's memory by object count, not object size.
"""

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from fractions import Fraction
from typing import Any, TypeVar

from fracgpu import codec, names
from fracgpu.errors import FracgpuError
from fracgpu.model import (
    Assignment,
    GPUAllocation,
    GPUDevice,
    NodeInventory,
    Quota,
    Reservation,
)
from fracgpu.quantity import parse_quantity
from webhook.queue import entry as queue_entry
from webhook.queue.entry import QueuedEntry
from webhook.rules.demand import cpu_and_memory
from webhook.rules.tolerations import Taint

Obj = dict[str, Any]
log = logging.getLogger(__name__)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
MIB = 2**20
_T = TypeVar("_T")


@dataclass(frozen=True)
class PodRecord:
    namespace: str
    name: str
    node: str  # spec.nodeName, or the assigned node while the pod is not yet bound
    cpu_milli: int
    memory_mib: int
    assignment: Assignment | None
    reservation_id: str
    terminal: bool
    # The assignment's allocations, flattened once (the view recounts them often).
    allocations: tuple[GPUAllocation, ...] = ()
    # Queue mode: what a queued pod asks (None: not queued), its UID and creation order.
    queued: QueuedEntry | None = None
    uid: str = ""

    @property
    def waiting(self) -> bool:
        """Queued, not placed yet, not finished: in fracgpu's queue."""
        return self.queued is not None and self.assignment is None and not self.terminal


@dataclass(frozen=True)
class NodeRecord:
    name: str
    cpu_milli: int
    memory_mib: int
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True)
class GPUNodeRecord:
    name: str
    resource_version: str
    devices: tuple[GPUDevice, ...]
    reservations: tuple[Reservation, ...]
    pool: str
    split_count: int | None
    unschedulable: bool
    memory_scaling: float | None = None
    compute_limit: bool | None = None
    # status.allocated + status.summary as last written, to write only on change
    published: str = ""

    def counted(self) -> tuple[object, ...]:
        """Everything of the record the view counts from (all but the version and what
        fracgpu publishes): two records equal in this are counted alike."""
        return (
            self.devices,
            self.reservations,
            self.pool,
            self.split_count,
            self.unschedulable,
            self.memory_scaling,
            self.compute_limit,
        )

    def inventory(self, node: NodeRecord | None) -> NodeInventory:
        cpu = node.cpu_milli if node else 0
        memory = node.memory_mib if node else 0
        return NodeInventory(
            self.name,
            self.devices,
            cpu,
            memory,
            self.pool,
            self.split_count,
            self.memory_scaling,
            self.compute_limit,
        )


def pod_record(obj: Obj) -> PodRecord | None:
    meta = obj.get("metadata", {})
    spec = obj.get("spec", {})
    annotations = meta.get("annotations") or {}
    assignment = _annotation(
        meta, annotations, names.ANNOTATION_ASSIGNMENT, "assignment", codec.decode_assignment
    )
    node = spec.get("nodeName") or (assignment.node if assignment else "")
    cpu, memory = pod_cpu_memory(obj)
    queued = _annotation(
        meta, annotations, names.ANNOTATION_QUEUED, "queued entry", queue_entry.decode
    )
    return PodRecord(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node=str(node),
        cpu_milli=cpu,
        memory_mib=memory,
        assignment=assignment,
        reservation_id=str(annotations.get(names.ANNOTATION_RESERVATION_ID, "")),
        terminal=obj.get("status", {}).get("phase") in TERMINAL_PHASES,
        allocations=assignment.allocations() if assignment else (),
        queued=queued,
        uid=str(meta.get("uid", "")),
    )


def _annotation(
    meta: Obj, annotations: Obj, key: str, what: str, decode: Callable[[str], _T]
) -> _T | None:
    """One place for reading a pod's fracgpu annotation: None where it is absent, and where
    it is unreadable too (logged), so that one bad pod never stops the watch cache."""
    raw = annotations.get(key)
    if raw is None:
        return None
    try:
        return decode(raw)
    except FracgpuError as error:
        log.warning(
            "pod %s/%s: ignoring bad %s: %s", meta.get("namespace"), meta.get("name"), what, error
        )
        return None


def pod_cpu_memory(obj: Obj) -> tuple[int, int]:
    """CPU (milli) and memory (MiB) the pod holds on its node, as admission computes them;
    a pod the API server stored but admission cannot read counts as nothing, not a crash."""
    try:
        return cpu_and_memory(obj)
    except FracgpuError:
        return 0, 0


def node_record(obj: Obj) -> NodeRecord | None:
    allocatable = obj.get("status", {}).get("allocatable") or {}
    labels = obj["metadata"].get("labels") or {}
    taints = (obj.get("spec") or {}).get("taints") or []
    return NodeRecord(
        name=str(obj["metadata"]["name"]),
        cpu_milli=_ceil(_quantity(allocatable.get("cpu")) * 1000),
        memory_mib=int(_quantity(allocatable.get("memory")) // MIB),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("effect", "")), str(t.get("value", "")))
            for t in taints
            if isinstance(t, dict)
        ),
    )


def gpunode_record(obj: Obj) -> GPUNodeRecord | None:
    meta = obj.get("metadata", {})
    name = str(meta.get("name", ""))
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    try:
        devices = codec.decode_devices(f"GPUNode {name} status.devices", status.get("devices", []))
        reservations = tuple(
            codec.decode_reservation(f"GPUNode {name} status.reservations[{i}]", r, name)
            for i, r in enumerate(status.get("reservations") or [])
        )
    except FracgpuError as error:
        # A GPUNode we cannot read offers no GPUs rather than wrong ones.
        log.warning("GPUNode %s is unreadable and offers no GPUs: %s", name, error)
        devices, reservations = (), ()
    return GPUNodeRecord(
        name=name,
        resource_version=str(meta.get("resourceVersion", "")),
        devices=devices,
        reservations=reservations,
        pool=str(spec.get("pool", "")),
        split_count=spec.get("splitCount"),
        unschedulable=bool(spec.get("unschedulable", False)),
        memory_scaling=_memory_scaling(name, spec.get("memoryScaling")),
        compute_limit=_compute_limit(name, spec.get("disableCoreLimit")),
        published=json.dumps(
            {"allocated": status.get("allocated") or [], "summary": status.get("summary") or {}},
            sort_keys=True,
        ),
    )


def _memory_scaling(name: str, raw: object) -> float | None:
    if raw is None:
        return None
    try:
        return codec.decode_memory_scaling(f"GPUNode {name} spec", raw)
    except FracgpuError as error:
        # The CRD schema should have refused it; the cluster default is the safe reading.
        log.warning("%s: using the cluster default", error)
        return None


def _compute_limit(name: str, disable_core_limit: object) -> bool | None:
    if disable_core_limit is None:
        return None
    if not isinstance(disable_core_limit, bool):
        log.warning("GPUNode %s spec.disableCoreLimit is not a boolean: using the default", name)
        return None
    return not disable_core_limit


@dataclass(frozen=True)
class QuotaRecord(Quota):
    """A GPUQuota as the watch cache holds it: ``has_status`` is False for a new one whose
    status.used nobody has written yet (the controllers write it at once)."""

    has_status: bool = True


def quota_record(obj: Obj) -> Quota | None:
    try:
        quota = codec.decode_quota(obj)
    except FracgpuError as error:
        log.warning("ignoring unreadable GPUQuota: %s", error)
        return None
    status = obj.get("status")
    has_status = isinstance(status, dict) and "used" in status
    return QuotaRecord(
        **{f.name: getattr(quota, f.name) for f in fields(quota)}, has_status=has_status
    )


def namespace_opted_out(obj: Obj) -> bool | None:
    labels = obj.get("metadata", {}).get("labels") or {}
    return labels.get(names.NAMESPACE_LABEL_OPT_OUT) == "true"


def _quantity(raw: object) -> Fraction:
    if raw is None:
        return Fraction(0)
    try:
        return max(Fraction(0), parse_quantity(raw))
    except FracgpuError:
        return Fraction(0)


def _ceil(value: Fraction) -> int:
    return -(-value.numerator // value.denominator)
