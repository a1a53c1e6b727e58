"""GPUQuota arithmetic, pure: what a pod's allocations count, whether they fit, and charging.

A pod counts cores (100 per whole GPU), memory MiB, and GPUs: allocations that hold a
GPU's full compute, and best-effort allocations (0 cores), which reserve no compute but are
paced by nothing, so may use all of it: they count as a GPU, never as nothing.

Per-model limits match GPU models the way users write them: the key is
a case-insensitive substring of the model ("A100" counts "NVIDIA A100-SXM4-80GB").
"""

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from fracgpu.model import GPUAllocation, Quota, Reservation, ResourceAmounts, ResourceLimits
from fracgpu.names import CORES_PER_GPU

_DIMENSIONS: Final = (
    ("cores", "cores"),
    ("memory_mib", "MiB memory"),
    ("gpus", "GPUs (whole or best effort)"),
)


@dataclass(frozen=True)
class QuotaExceeded:
    quota: str
    model: str
    dimension: str
    asked: int
    used: int
    allowed: int

    @property
    def message(self) -> str:
        scope = f' for GPU model "{self.model}"' if self.model else ""
        return (
            f"GPUQuota {self.quota}{scope} is exceeded: this pod asks {self.asked} "
            f"{self.dimension}, {self.used} are in use and {self.allowed} are allowed. Free "
            "some in this namespace, lower the request, or ask for a larger quota"
        )


def amounts(allocations: Iterable[GPUAllocation]) -> ResourceAmounts:
    total = ResourceAmounts()
    for alloc in allocations:
        whole = 1 if alloc.cores >= CORES_PER_GPU or alloc.cores == 0 else 0
        total = total + ResourceAmounts(alloc.cores, alloc.memory_mib, whole)
    return total


def reservation_charges(
    held: Reservation, now: float, live: Container[str], departed: Container[str]
) -> bool:
    """The one rule for whether a reservation holds its slices (capacity in the view) and
    charges them (to its namespace's GPUQuota): while it is open, and no longer once it has
    expired, once its pod is live (the pod holds and charges the same slices instead, so they
    are not counted twice) or once its pod has come and gone. ``live`` and ``departed`` are
    reservation IDs of live pods and of pods that finished or were deleted. Admission's view,
    the quota recount and ``kubectl fracgpu nodes`` all ask this function."""
    return held.expires_at > now and held.id not in live and held.id not in departed


def model_matches(key: str, model: str) -> bool:
    return key.lower() in model.lower()


def amounts_for_model(
    allocations: Iterable[GPUAllocation], models: Mapping[str, str], key: str
) -> ResourceAmounts:
    """Amounts on GPUs whose model matches ``key`` (``models`` maps UUID -> model)."""
    return amounts(a for a in allocations if model_matches(key, models.get(a.uuid, "")))


def check(
    quotas: Sequence[Quota], allocations: Sequence[GPUAllocation], models: Mapping[str, str]
) -> QuotaExceeded | None:
    """The first limit these allocations would break, or None when every quota allows them."""
    for quota in quotas:
        label = f"{quota.namespace}/{quota.name}"
        over = _over(label, "", quota.hard, quota.used, amounts(allocations))
        if over is not None:
            return over
        for key, limits in sorted(quota.hard_by_model.items()):
            asked = amounts_for_model(allocations, models, key)
            used = quota.used_by_model.get(key, ResourceAmounts())
            over = _over(label, key, limits, used, asked)
            if over is not None:
                return over
    return None


def charge(
    quota: Quota, allocations: Sequence[GPUAllocation], models: Mapping[str, str], sign: int = 1
) -> Quota:
    """The quota with these allocations added to (sign 1) or removed from (-1) its use."""
    delta = amounts(allocations)
    used = quota.used + delta if sign > 0 else (quota.used - delta).clamp_at_zero()
    by_model = dict(quota.used_by_model)
    for key in quota.hard_by_model:
        part = amounts_for_model(allocations, models, key)
        before = by_model.get(key, ResourceAmounts())
        by_model[key] = before + part if sign > 0 else (before - part).clamp_at_zero()
    return replace(quota, used=used, used_by_model=by_model)


def allowed_pools(quotas: Sequence[Quota]) -> tuple[str, ...] | None:
    """Pools every quota allows (None = no quota restricts pools; () = no pool at all)."""
    allowed: set[str] | None = None
    for quota in quotas:
        if quota.pools:
            allowed = set(quota.pools) if allowed is None else allowed & set(quota.pools)
    return None if allowed is None else tuple(sorted(allowed))


def _over(
    quota: str, model: str, hard: ResourceLimits, used: ResourceAmounts, asked: ResourceAmounts
) -> QuotaExceeded | None:
    for attribute, unit in _DIMENSIONS:
        limit = getattr(hard, attribute)
        want = getattr(asked, attribute)
        have = getattr(used, attribute)
        if limit is not None and want > 0 and have + want > limit:
            return QuotaExceeded(quota, model, unit, want, have, limit)
    return None
