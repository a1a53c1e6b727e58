"""Namespace GPU quota: what an assignment costs, and whether a quota allows it."""

from collections.abc import Iterable, Mapping

from fracgpu.model import GPUAllocation, Quota, ResourceAmounts, ResourceLimits
from fracgpu.names import CORES_PER_GPU


def cost(allocations: Iterable[GPUAllocation]) -> ResourceAmounts:
    """Cores, memory and whole GPUs that a set of allocations uses."""
    total = ResourceAmounts()
    for alloc in allocations:
        whole = 1 if alloc.cores >= CORES_PER_GPU else 0
        total += ResourceAmounts(alloc.cores, alloc.memory_mib, whole)
    return total


def cost_by_model(
    allocations: Iterable[GPUAllocation], model_of: Mapping[str, str]
) -> dict[str, ResourceAmounts]:
    """The same, split by GPU model (allocations on unknown GPUs count under "unknown")."""
    result: dict[str, ResourceAmounts] = {}
    for alloc in allocations:
        model = model_of.get(alloc.uuid, "unknown")
        result[model] = result.get(model, ResourceAmounts()) + cost((alloc,))
    return result


def check(
    quota: Quota, ask: ResourceAmounts, ask_by_model: Mapping[str, ResourceAmounts]
) -> str | None:
    """None when the quota allows the ask; otherwise a message naming quota, ask, used, hard."""
    where = f'GPUQuota "{quota.namespace}/{quota.name}"'
    problem = _over(quota.hard, quota.used, ask)
    if problem:
        return f"{where}: {problem}"
    for model, model_ask in sorted(ask_by_model.items()):
        limits = _limits_for_model(quota.hard_by_model, model)
        if limits is None:
            continue
        used = quota.used_by_model.get(model, ResourceAmounts())
        problem = _over(limits, used, model_ask)
        if problem:
            return f"{where} for GPU model {model}: {problem}"
    return None


def charge(
    quota: Quota, ask: ResourceAmounts, ask_by_model: Mapping[str, ResourceAmounts]
) -> Quota:
    """The quota with the ask added to its used amounts."""
    by_model = dict(quota.used_by_model)
    for model, amounts in ask_by_model.items():
        by_model[model] = (by_model.get(model, ResourceAmounts()) + amounts).clamp_at_zero()
    by_model = {m: a for m, a in by_model.items() if a != ResourceAmounts()}
    return Quota(
        quota.namespace,
        quota.name,
        quota.hard,
        quota.hard_by_model,
        quota.pools,
        (quota.used + ask).clamp_at_zero(),
        by_model,
        quota.resource_version,
    )


def refund(
    quota: Quota, ask: ResourceAmounts, ask_by_model: Mapping[str, ResourceAmounts]
) -> Quota:
    negative = {m: ResourceAmounts() - a for m, a in ask_by_model.items()}
    return charge(quota, ResourceAmounts() - ask, negative)


def _limits_for_model(
    hard_by_model: Mapping[str, ResourceLimits], model: str
) -> ResourceLimits | None:
    """Per-model limits match the way users write models: "T4" covers "Tesla T4"."""
    if model in hard_by_model:
        return hard_by_model[model]
    lowered = model.lower()
    for key, limits in sorted(hard_by_model.items()):
        if key.lower() in lowered:
            return limits
    return None


def _over(hard: ResourceLimits, used: ResourceAmounts, ask: ResourceAmounts) -> str | None:
    for label, limit, in_use, asked in (
        ("cores (vcuda-core)", hard.cores, used.cores, ask.cores),
        ("GPU memory MiB", hard.memory_mib, used.memory_mib, ask.memory_mib),
        ("whole GPUs", hard.gpus, used.gpus, ask.gpus),
    ):
        if limit is not None and asked > 0 and in_use + asked > limit:
            room = max(0, limit - in_use)
            return (
                f"this pod asks for {asked} {label}, {in_use} of {limit} are used, "
                f"so at most {room} more are allowed"
            )
    return None
