"""Validation rules, pure: tampering, changes on update, and "is this exactly what fracgpu wrote".

Each rule returns findings (short phrases naming what is wrong); an empty list passes.
"""

from collections.abc import Collection, Mapping
from typing import Any, Final

from fracgpu import names
from fracgpu.codec import decode_assignment
from fracgpu.dialects import DialectConfig
from fracgpu.errors import CodecError
from fracgpu.model import Assignment, Reservation
from fracgpu.quantity import shown
from webhook.admission.mutate import Toleration, patch_for
from webhook.rules import pod as podlib

# What fracgpu itself writes on a pod it placed.
WRITTEN_METADATA: Final = frozenset(
    {
        ("annotations", names.ANNOTATION_ASSIGNMENT),
        ("annotations", names.ANNOTATION_RESERVATION_ID),
        ("labels", names.LABEL_MANAGED),
        ("labels", names.LABEL_ASSIGNED_NODE),
    }
)
STEERING_ANNOTATIONS: Final = (
    *sorted(names.USER_ANNOTATIONS),
    names.HAMI_ANNOTATION_USE_GPUTYPE,
    names.HAMI_ANNOTATION_NOUSE_GPUTYPE,
    names.HAMI_ANNOTATION_USE_GPUUUID,
    names.HAMI_ANNOTATION_NOUSE_GPUUUID,
)
MAX_FINDINGS_SHOWN: Final = 8
# fracgpu's own entry on a container that holds no GPU.
VOID_ENTRY: Final = {"name": names.ENV_VISIBLE_DEVICES, "value": names.VISIBLE_DEVICES_NONE}


def tamper_findings(
    pod: Mapping[str, Any], *, placed_by_fracgpu: bool, void_allowed: bool
) -> list[str]:
    """Reserved keys and variables a user set. ``placed_by_fracgpu``: the pod carries an
    assignment that was verified, so what fracgpu writes is expected; ``void_allowed``: a
    non-GPU pod may already carry fracgpu's ``NVIDIA_VISIBLE_DEVICES=void``."""
    findings = []
    for kind, keys in podlib.reserved_metadata(pod).items():
        for key in sorted(keys):
            if placed_by_fracgpu and (kind, key) in WRITTEN_METADATA:
                continue
            findings.append(f"{kind[:-1]} {key}")
    for container, variables in podlib.reserved_env(pod).items():
        for name, entry in sorted(variables.items()):
            if name == names.ENV_VISIBLE_DEVICES and placed_by_fracgpu:
                continue  # its value is checked against the assignment
            if name == names.ENV_VISIBLE_DEVICES and void_allowed and dict(entry) == VOID_ENTRY:
                continue
            findings.append(f'variable {name} in container "{container}"')
    return findings


def scheduler_finding(pod: Mapping[str, Any], scheduler_name: str) -> str:
    """Why a pod may not name fracgpu's scheduler itself, or "": that scheduler binds only
    pods fracgpu queued, with the GPUs it picks (a pod naming it would skip the queue)."""
    if podlib.spec(pod).get("schedulerName") != scheduler_name:
        return ""
    return (
        f"spec.schedulerName={scheduler_name!r} is fracgpu's own scheduler, which only pods "
        "fracgpu queued may use: remove it (fracgpu sets it when a GPU pod has to wait)"
    )


def tamper_message(findings: Collection[str], operation: str) -> str:
    shown = list(findings)[:MAX_FINDINGS_SHOWN]
    more = f" and {len(findings) - len(shown)} more" if len(findings) > len(shown) else ""
    return (
        f"{operation} sets {', '.join(shown)}{more}, which only fracgpu may set. Remove "
        f"{'it' if len(findings) == 1 else 'them'}: fracgpu chooses GPUs and writes these "
        f"itself. To steer placement use the annotations {', '.join(STEERING_ANNOTATIONS)}; "
        f"to lower a limit inside a container use {', '.join(sorted(names.USER_SHIM_VARIABLES))}"
    )


def update_findings(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Reserved keys and variables that an update adds, changes or removes."""
    findings = []
    old_meta, new_meta = podlib.reserved_metadata(old), podlib.reserved_metadata(new)
    for kind in ("annotations", "labels"):
        for key in sorted(old_meta[kind].keys() | new_meta[kind].keys()):
            if old_meta[kind].get(key) != new_meta[kind].get(key):
                findings.append(f"{kind[:-1]} {key}")
    old_env, new_env = podlib.reserved_env(old), podlib.reserved_env(new)
    for container in sorted(old_env.keys() | new_env.keys()):
        before, after = old_env.get(container, {}), new_env.get(container, {})
        for name in sorted(before.keys() | after.keys()):
            if before.get(name) != after.get(name):
                findings.append(f'variable {name} in container "{container}"')
    return findings


def read_assignment(annotations: Mapping[str, str]) -> Assignment | str:
    """The pod's assignment, or why the annotations do not hold a usable one."""
    try:
        assignment = decode_assignment(annotations[names.ANNOTATION_ASSIGNMENT])
    except CodecError as error:
        return str(error)
    reservation_id = annotations.get(names.ANNOTATION_RESERVATION_ID)
    if reservation_id is None:
        return (
            f"annotation {names.ANNOTATION_RESERVATION_ID} is missing while the assignment "
            f"names reservation {assignment.reservation_id!r}"
        )
    if reservation_id != assignment.reservation_id:
        return (
            f"annotation {names.ANNOTATION_RESERVATION_ID}={reservation_id!r} does not match "
            f"the assignment's reservation {assignment.reservation_id!r}"
        )
    return assignment


def assignment_findings(
    assignment: Assignment,
    gpu_containers: Collection[str],
    namespace: str,
    reservation: Reservation | None,
    *,
    check_reservation: bool,
    presenting: str,
) -> list[str]:
    """Whether the assignment covers exactly the GPU containers and matches a reservation
    made for this pod (``presenting``: its ``pod_name``)."""
    findings = []
    assigned = {c.container for c in assignment.containers}
    if assigned != set(gpu_containers):
        findings.append(
            f"the assignment covers containers {sorted(assigned)} but the GPU containers "
            f"are {sorted(gpu_containers)}"
        )
    if check_reservation:
        if reservation is None:
            findings.append(
                f"reservation {assignment.reservation_id!r} is not one fracgpu holds "
                "(it expired or was never made)"
            )
        elif (
            reservation.node != assignment.node
            or reservation.namespace != namespace
            or sorted(reservation.allocations, key=_key)
            != sorted(assignment.allocations(), key=_key)
        ):
            findings.append(
                f"the assignment differs from reservation {assignment.reservation_id!r} "
                f"(node {reservation.node}, namespace {reservation.namespace})"
            )
        elif not podlib.same_pod(reservation.pod, presenting):
            # Same slice, same namespace, another pod: two pods would run in one slice.
            findings.append(
                f"reservation {assignment.reservation_id!r} was made for pod "
                f"{shown(reservation.pod)!r}, not for this pod {shown(presenting)!r}: an "
                "assignment copied from another pod"
            )
    return findings


def drift_findings(
    pod: Mapping[str, Any],
    assignment: Assignment,
    config: DialectConfig,
    *,
    toleration: Toleration = None,
) -> list[str]:
    """Where the pod differs from what fracgpu writes for this assignment (JSON paths)."""
    patch = patch_for(pod, assignment, config, toleration=toleration)
    return [f"{op['op']} {op['path']}" for op in patch]


def _key(alloc: Any) -> tuple[str, int, int]:
    return (alloc.uuid, alloc.cores, alloc.memory_mib)
