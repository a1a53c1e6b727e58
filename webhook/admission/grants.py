"""What an administrator granted a namespace (GPUQuota ``spec.grants``), pure.

Tenants cannot write GPUQuotas (RBAC), so a right held there is granted, never
self-assigned. Grants add up: a namespace holds a right when any of its GPUQuotas grants
it. Default (no GPUQuota, or none with ``grants``): no right beyond the default.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from fracgpu import names
from fracgpu.model import Grants, Priority, Quota

PRIORITY_GRANT: Final = "spec.grants.priority"
PRIVILEGED_GRANT: Final = "spec.grants.privilegedContainers"
# Annotation -> the value that asks for high priority (fracgpu's word, HAMi's number).
_HIGH_ANNOTATIONS: Final = (
    (names.ANNOTATION_PRIORITY, "high"),
    (names.HAMI_ANNOTATION_PRIORITY, "0"),
)


def granted(quotas: Iterable[Quota]) -> Grants:
    """The namespace's rights: the union of its GPUQuotas' grants."""
    high = privileged = False
    for quota in quotas:
        high = high or quota.grants.priority is Priority.HIGH
        privileged = privileged or quota.grants.privileged
    return Grants(Priority.HIGH if high else Priority.LOW, privileged)


def high_priority_asks(
    annotations: Mapping[str, str],
    containers: Sequence[tuple[str, Priority | None]],
    priority_resource: str,
) -> list[str]:
    """Where a pod asks for high compute priority, read as the agent reads it: a GPU
    container's own priority (HAMi's limit, ``containers``: name and priority) wins, else the
    pod's annotation, fracgpu's before HAMi's. No containers given (an update): the pod's
    annotation alone."""
    found = []
    pod_level = _pod_annotation(annotations) if annotations else None
    if pod_level is not None and (
        not containers or any(priority is None for _, priority in containers)
    ):
        found.append(f"annotation {pod_level}")
    for name, priority in containers:
        if priority is Priority.HIGH:
            found.append(f'container "{name}" {priority_resource}=0')
    return found


def _pod_annotation(annotations: Mapping[str, str]) -> str | None:
    """``key=value`` of the priority annotation the agent applies, when it says high."""
    for key, high in _HIGH_ANNOTATIONS:
        if key in annotations:
            return f"{key}={high}" if annotations[key] == high else None
    return None


def priority_changed(old: Mapping[str, str], new: Mapping[str, str]) -> bool:
    """Whether an update touches the priority annotations (the agent reads them at start)."""
    return any(old.get(key) != new.get(key) for key, _ in _HIGH_ANNOTATIONS)


def priority_denial(namespace: str, quotas: Sequence[Quota], asks: Sequence[str]) -> str | None:
    """Why a pod asking ``asks`` is denied, or None when the namespace holds the grant."""
    if not asks or granted(quotas).priority is Priority.HIGH:
        return None
    return (
        f"this pod asks for high compute priority ({', '.join(asks)}), but namespace "
        f"{namespace} has no grant for it: {PRIORITY_GRANT} is not high in "
        f"{_quotas_named(quotas)}. High priority lets a container push its neighbours' share "
        "down, so only an administrator grants it (set "
        f"{PRIORITY_GRANT}: high in a GPUQuota of the namespace); otherwise remove it"
    )


def privileged_denial(
    namespace: str, quotas: Sequence[Quota], findings: Sequence[str]
) -> str | None:
    """Why a GPU pod with privileged ``findings`` is denied, or None when granted."""
    if not findings or granted(quotas).privileged:
        return None
    return (
        f"this GPU pod sets {', '.join(findings)}, which can undo the GPU slice (unmount or "
        f"bypass the shim, reach every GPU or a neighbour's process), and namespace {namespace} "
        f"has no grant for it: {PRIVILEGED_GRANT} is not true in {_quotas_named(quotas)}. "
        "Remove it, or ask an administrator to set "
        f"{PRIVILEGED_GRANT}: true in a GPUQuota of the namespace"
    )


def _quotas_named(quotas: Sequence[Quota]) -> str:
    if not quotas:
        return "any GPUQuota (the namespace has none)"
    shown = ", ".join(sorted(q.name for q in quotas)[:8])
    return f"its GPUQuota(s) {shown}"
