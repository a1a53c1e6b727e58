"""Reports built from API objects (plain JSON dicts): pure functions, no I/O.

Nodes: per GPU, what the live pods' assignment annotations hold, plus the reservations that
still hold capacity (``quota.reservation_charges``: open, pod not live yet and not gone).
Quotas: GPUQuota hard and used. Pod: one pod's assignment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fracgpu import codec, names
from fracgpu.errors import FracgpuError
from fracgpu.model import Assignment, GPUDevice, Quota, ResourceAmounts
from webhook.rules import quota as quotalib

Obj = Mapping[str, Any]
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class Slice:
    """One container's share of one GPU."""

    namespace: str
    pod: str
    container: str
    cores: int
    memory_mib: int
    reserved: bool = False  # a reservation whose pod is not visible yet

    @property
    def owner(self) -> str:
        if self.reserved:
            return f"{self.namespace}/{self.pod or '<pending>'} (reserved)"
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass(frozen=True)
class GPUReport:
    uuid: str
    index: int
    model: str
    healthy: bool
    cores_total: int  # 0 for a GPU in MIG mode: fracgpu never shares it
    memory_total_mib: int
    slices: tuple[Slice, ...]
    mig: bool = False

    @property
    def containers(self) -> int:
        return len(self.slices)

    @property
    def cores_allocated(self) -> int:
        return sum(s.cores for s in self.slices)

    @property
    def memory_allocated_mib(self) -> int:
        return sum(s.memory_mib for s in self.slices)


@dataclass(frozen=True)
class NodeReport:
    name: str
    gpus: tuple[GPUReport, ...]
    problems: tuple[str, ...] = ()  # unreadable inventory or reservations of this node
    split_count: int | None = None  # GPUNode spec.splitCount; None: the webhook's setting

    @property
    def cores_allocated(self) -> int:
        return sum(g.cores_allocated for g in self.gpus)

    @property
    def cores_total(self) -> int:
        return sum(g.cores_total for g in self.gpus)

    @property
    def memory_allocated_mib(self) -> int:
        return sum(g.memory_allocated_mib for g in self.gpus)

    @property
    def memory_total_mib(self) -> int:
        return sum(g.memory_total_mib for g in self.gpus)


@dataclass(frozen=True)
class ContainerUsage:
    """Live figures from the node agent's metrics, when they could be read."""

    gpu: str
    memory_used_bytes: int | None = None
    memory_limit_bytes: int | None = None
    utilization_ratio: float | None = None
    oom_rejections: int | None = None


@dataclass(frozen=True)
class PodDevice:
    uuid: str
    index: int | None
    model: str
    cores: int
    memory_mib: int


@dataclass(frozen=True)
class PodContainer:
    name: str
    devices: tuple[PodDevice, ...]


@dataclass(frozen=True)
class PodReport:
    namespace: str
    name: str
    phase: str
    node: str
    reservation_id: str
    containers: tuple[PodContainer, ...]
    usage: Mapping[str, tuple[ContainerUsage, ...]] = field(default_factory=dict)
    usage_note: str = ""


class ReportError(Exception):
    """The objects cannot answer the question (e.g. the pod has no GPU assignment)."""


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def pod_assignment(pod: Obj) -> Assignment | None:
    """The decoded assignment annotation; None if absent. A bad one raises ReportError."""
    raw = (_meta(pod).get("annotations") or {}).get(names.ANNOTATION_ASSIGNMENT)
    if raw is None:
        return None
    try:
        return codec.decode_assignment(str(raw))
    except FracgpuError as error:
        meta = _meta(pod)
        raise ReportError(f"pod {meta.get('namespace')}/{meta.get('name')}: {error}") from None


def _live(pod: Obj) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") not in TERMINAL_PHASES and not _meta(pod).get("deletionTimestamp")


def _devices(gpunode: Obj) -> tuple[GPUDevice, ...]:
    status = gpunode.get("status") or {}
    return codec.decode_devices(
        f"GPUNode {_meta(gpunode).get('name')} status.devices", status.get("devices") or []
    )


@dataclass(frozen=True)
class NodesView:
    nodes: tuple[NodeReport, ...]
    problems: tuple[str, ...]  # pods whose assignment cannot be read


def build_nodes(gpunodes: Iterable[Obj], pods: Iterable[Obj], *, now: float) -> NodesView:
    """One report per GPUNode, sorted by name; pods matched by their assignment's node.
    ``now`` (unix seconds) decides which reservations have expired."""
    slices_by_gpu: dict[tuple[str, str], list[Slice]] = {}
    seen_reservations: set[str] = set()
    departed: set[str] = set()  # reservations whose pod finished: they hold nothing now
    pod_problems: list[str] = []
    for pod in pods:
        meta = _meta(pod)
        try:
            assignment = pod_assignment(pod)
        except ReportError as error:
            pod_problems.append(str(error))
            continue
        if assignment is None:
            continue
        if not _live(pod):
            departed.add(assignment.reservation_id)
            continue
        seen_reservations.add(assignment.reservation_id)
        for held in assignment.containers:
            for device in held.devices:
                slices_by_gpu.setdefault((assignment.node, device.uuid), []).append(
                    Slice(
                        str(meta.get("namespace", "")),
                        str(meta.get("name", "")),
                        held.container,
                        device.cores,
                        device.memory_mib,
                    )
                )
    reports = []
    for gpunode in sorted(gpunodes, key=lambda o: str(_meta(o).get("name", ""))):
        node = str(_meta(gpunode).get("name", ""))
        node_problems: list[str] = []
        try:
            devices = _devices(gpunode)
        except FracgpuError as error:
            reports.append(NodeReport(node, (), (str(error),)))
            continue
        for reservation in (gpunode.get("status") or {}).get("reservations") or []:
            try:
                pending = codec.decode_reservation("reservation", reservation, node)
            except FracgpuError as error:
                node_problems.append(str(error))
                continue
            if not quotalib.reservation_charges(pending, now, seen_reservations, departed):
                continue  # expired, or its pod is counted above, or its pod has finished
            for alloc in pending.allocations:
                slices_by_gpu.setdefault((node, alloc.uuid), []).append(
                    Slice(pending.namespace, pending.pod, "", alloc.cores, alloc.memory_mib, True)
                )
        gpus = tuple(
            GPUReport(
                uuid=d.uuid,
                index=d.index,
                model=d.model,
                healthy=d.healthy,
                cores_total=0 if d.mig_enabled else names.CORES_PER_GPU,
                memory_total_mib=0 if d.mig_enabled else d.memory_mib,
                slices=tuple(sorted(slices_by_gpu.get((node, d.uuid), []), key=lambda s: s.owner)),
                mig=d.mig_enabled,
            )
            for d in sorted(devices, key=lambda d: d.index)
        )
        split = _split_count(gpunode, node_problems)
        reports.append(NodeReport(node, gpus, tuple(node_problems), split))
    return NodesView(tuple(reports), tuple(pod_problems))


def _split_count(gpunode: Obj, problems: list[str]) -> int | None:
    value = (gpunode.get("spec") or {}).get("splitCount")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append(f"spec.splitCount={value!r} is not a whole number of 1 or more")
        return None
    return value


def build_quotas(quotas: Iterable[Obj]) -> list[Quota]:
    decoded = [codec.decode_quota(dict(q)) for q in quotas]
    return sorted(decoded, key=lambda q: (q.namespace, q.name))


def build_pod(
    pod: Obj,
    gpunode: Obj | None,
    usage: Mapping[str, tuple[ContainerUsage, ...]] | None = None,
    usage_note: str = "",
) -> PodReport:
    meta = _meta(pod)
    where = f"pod {meta.get('namespace')}/{meta.get('name')}"
    assignment = pod_assignment(pod)
    if assignment is None:
        raise ReportError(
            f"{where} has no fracgpu assignment: it asks for no GPU, or it was created in a "
            f"namespace fracgpu does not manage ({names.NAMESPACE_LABEL_OPT_OUT}=true)"
        )
    devices = {d.uuid: d for d in (_devices(gpunode) if gpunode else ())}
    containers = tuple(
        PodContainer(
            held.container,
            tuple(
                PodDevice(
                    uuid=alloc.uuid,
                    index=devices[alloc.uuid].index if alloc.uuid in devices else None,
                    model=devices[alloc.uuid].model if alloc.uuid in devices else "unknown",
                    cores=alloc.cores,
                    memory_mib=alloc.memory_mib,
                )
                for alloc in held.devices
            ),
        )
        for held in assignment.containers
    )
    status = pod.get("status") or {}
    return PodReport(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        phase=str(status.get("phase", "Unknown")),
        node=assignment.node,
        reservation_id=assignment.reservation_id,
        containers=containers,
        usage=dict(usage or {}),
        usage_note=usage_note,
    )


def build_pods(pods: Iterable[Obj], gpunodes: Iterable[Obj]) -> tuple[list[PodReport], list[str]]:
    """Every pod with an assignment, sorted by namespace and name; problems for the rest."""
    by_name = {str(_meta(g).get("name", "")): g for g in gpunodes}
    reports, problems = [], []
    for pod in pods:
        try:
            assignment = pod_assignment(pod)
            if assignment is None:
                continue
            reports.append(build_pod(pod, by_name.get(assignment.node)))
        except (ReportError, FracgpuError) as error:
            problems.append(str(error))
    reports.sort(key=lambda r: (r.namespace, r.name))
    return reports, problems


def node_to_dict(report: NodeReport) -> dict[str, Any]:
    return {
        "node": report.name,
        "compute": {"allocated": report.cores_allocated, "total": report.cores_total},
        "memoryMiB": {"allocated": report.memory_allocated_mib, "total": report.memory_total_mib},
        "splitCount": report.split_count,
        "gpus": [
            {
                "uuid": g.uuid,
                "index": g.index,
                "model": g.model,
                "healthy": g.healthy,
                "mig": g.mig,
                "containers": g.containers,
                "compute": {"allocated": g.cores_allocated, "total": g.cores_total},
                "memoryMiB": {"allocated": g.memory_allocated_mib, "total": g.memory_total_mib},
                "slices": [
                    {
                        "namespace": s.namespace,
                        "pod": s.pod,
                        "container": s.container,
                        "cores": s.cores,
                        "memoryMiB": s.memory_mib,
                        "reserved": s.reserved,
                    }
                    for s in g.slices
                ],
            }
            for g in report.gpus
        ],
        "problems": list(report.problems),
    }


def quota_to_dict(quota: Quota) -> dict[str, Any]:
    return {
        "namespace": quota.namespace,
        "name": quota.name,
        "hard": codec.encode_limits(quota.hard),
        "used": codec.encode_amounts(quota.used),
        "models": {
            model: {
                "hard": codec.encode_limits(limits),
                "used": codec.encode_amounts(quota.used_by_model.get(model, ResourceAmounts())),
            }
            for model, limits in sorted(quota.hard_by_model.items())
        },
        "pools": list(quota.pools),
    }


def pod_to_dict(report: PodReport) -> dict[str, Any]:
    return {
        "namespace": report.namespace,
        "name": report.name,
        "phase": report.phase,
        "node": report.node,
        "reservationId": report.reservation_id,
        "containers": [
            {
                "name": c.name,
                "devices": [
                    {
                        "uuid": d.uuid,
                        "index": d.index,
                        "model": d.model,
                        "cores": d.cores,
                        "memoryMiB": d.memory_mib,
                    }
                    for d in c.devices
                ],
                "usage": [asdict(u) for u in report.usage.get(c.name, ())],
            }
            for c in report.containers
        ],
        "usageNote": report.usage_note,
    }
