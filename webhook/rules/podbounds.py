"""Bounds on the parts of a pod that admission reads, checked before any rule runs.

kube-apiserver bounds a pod only by its size (about 1.5 MB in etcd), which holds tens of
thousands of containers, env entries, tolerations or node-affinity requirements. Admission's
work grows with each of them, so each has a limit here (a setting, ``PodLimits``), and a pod
over one is denied with a message naming the setting and its value. Container names must
also be unique across init, app and ephemeral containers, as the API server requires: fracgpu
keys its assignment by name.

The check itself costs no more than the limits allow: counts are list lengths, and a list is
walked only after its length (or the running total) has been checked.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from fracgpu import names
from webhook.rules import pod as podlib

_REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True, slots=True)
class PodLimits:
    """Most of each part of one pod that admission reads (each a webhook setting)."""

    max_containers: int = 64
    max_gpu_containers: int = 16
    max_env_entries: int = 2048
    max_tolerations: int = 256
    max_volumes: int = 512
    max_node_selector_terms: int = 64
    max_node_requirements: int = 512
    max_node_requirement_values: int = 4096


# Setting key -> what it counts, for messages and docs.
COUNTED: Final = {
    "max_containers": "containers (initContainers, containers and ephemeralContainers together)",
    "max_gpu_containers": "containers asking for GPUs",
    "max_env_entries": "env entries (all containers together, fracgpu's own not counted)",
    "max_tolerations": "tolerations",
    "max_volumes": "volumes (fracgpu's own not counted)",
    "max_node_selector_terms": "required node-affinity nodeSelectorTerms",
    "max_node_requirements": (
        "nodeSelector entries plus required node-affinity matchExpressions and matchFields "
        "(all terms together)"
    ),
    "max_node_requirement_values": "values of required node-affinity requirements (all together)",
}


def problem(pod: Mapping[str, Any], limits: PodLimits) -> str | None:
    """Why admission will not read this pod (a limit it is over, or duplicate container
    names), or None. Parts with the wrong shape are left to the rules, which name them."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return None
    return (
        _containers(spec, limits)
        or _count(_length(spec.get("tolerations")), "max_tolerations", limits)
        or _count(_tenant_volumes(spec), "max_volumes", limits)
        or _node_requirements(spec, limits)
    )


def gpu_containers_problem(count: int, limits: PodLimits) -> str | None:
    """Placement's work grows with the GPU containers of a pod (each is fitted on every
    candidate node), so they have a limit of their own; the rules count them."""
    return _count(count, "max_gpu_containers", limits)


def _message(key: str, limits: PodLimits, count: int, *, exact: bool = True) -> str:
    value = getattr(limits, key)
    return (
        f"this pod has {'' if exact else 'at least '}{count} {COUNTED[key]}, over "
        f"fracgpu's limit of {value} (setting {key.replace('_', '-')}): split the workload "
        "across pods, or ask the cluster administrator to raise the limit"
    )


def _count(count: int, key: str, limits: PodLimits) -> str | None:
    return _message(key, limits, count) if count > getattr(limits, key) else None


def _tenant_volumes(spec: Mapping[str, Any]) -> int:
    """The pod's volumes but the region volumes fracgpu gives its containers (by name: at most
    one per container, so the containers' own limit bounds them)."""
    volumes = spec.get("volumes")
    if not isinstance(volumes, list):
        return _length(volumes)
    own = {
        names.region_volume_name(c["name"])
        for field in podlib.ALL_FIELDS
        if isinstance(spec.get(field), list)
        for c in spec[field]
        if isinstance(c, dict) and isinstance(c.get("name"), str)
    }
    return sum(
        1
        for v in volumes
        if not (isinstance(v, dict) and isinstance(v.get("name"), str) and v["name"] in own)
    )


def _length(value: object) -> int:
    return len(value) if isinstance(value, list | dict) else 0


def _containers(spec: Mapping[str, Any], limits: PodLimits) -> str | None:
    lists = [spec.get(field) for field in podlib.ALL_FIELDS]
    over = _count(sum(_length(items) for items in lists), "max_containers", limits)
    if over:
        return over
    env_entries = 0
    seen: dict[str, str] = {}
    for field, items in zip(podlib.ALL_FIELDS, lists, strict=True):
        if not isinstance(items, list):
            continue
        for index, container in enumerate(items):
            if not isinstance(container, dict):
                continue
            env_entries += _length(container.get("env"))
            name = container.get("name")
            if not isinstance(name, str) or not name:
                continue
            where = f".spec.{field}[{index}]"
            if name in seen:
                return (
                    f'container name "{name}" is used twice ({seen[name]} and {where}): names '
                    "must be unique across initContainers, containers and ephemeralContainers"
                )
            seen[name] = where
    if limits.max_env_entries < env_entries <= limits.max_env_entries + len(seen):
        # fracgpu writes NVIDIA_VISIBLE_DEVICES into every container: those are not counted,
        # or the pod it mutated would be over the limit at validation (a short walk: the
        # total is at most the limit plus one per container)
        env_entries -= sum(_fracgpus_entry(c) for items in lists for c in _objects(items))
    return _count(env_entries, "max_env_entries", limits)


def _objects(items: object) -> list[dict[str, Any]]:
    return [c for c in items if isinstance(c, dict)] if isinstance(items, list) else []


def _fracgpus_entry(container: Mapping[str, Any]) -> bool:
    return any(
        isinstance(e, dict) and e.get("name") == names.ENV_VISIBLE_DEVICES
        for e in _objects(container.get("env"))
    )


def _node_requirements(spec: Mapping[str, Any], limits: PodLimits) -> str | None:
    requirements = _length(spec.get("nodeSelector"))
    terms = _required_terms(spec)
    over = _count(len(terms), "max_node_selector_terms", limits)
    if over:
        return over
    values = 0
    for term in terms:
        if not isinstance(term, dict):
            continue
        pinned = False  # fracgpu's own pin (one per term) is not counted: see _is_pin
        for key in ("matchExpressions", "matchFields"):
            items = term.get(key)
            requirements += _length(items)
            if requirements > limits.max_node_requirements + len(terms):
                return _message("max_node_requirements", limits, requirements, exact=False)
            for item in items if isinstance(items, list) else ():
                if not isinstance(item, dict):
                    continue
                if not pinned and key == "matchFields" and _is_pin(item):
                    pinned = True
                    requirements -= 1
                    continue
                values += _length(item.get("values"))
                if values > limits.max_node_requirement_values:
                    return _message("max_node_requirement_values", limits, values, exact=False)
    return _count(requirements, "max_node_requirements", limits)


def _is_pin(requirement: Mapping[str, Any]) -> bool:
    """``metadata.name In [node]``: what fracgpu ANDs into every term to pin a pod it placed
    (webhook.admission.mutate), or the pod would be over a limit at validation that it was not at
    mutation."""
    values = requirement.get("values")
    return (
        requirement.get("key") == "metadata.name"
        and requirement.get("operator") == "In"
        and isinstance(values, list)
        and len(values) == 1
    )


def _required_terms(spec: Mapping[str, Any]) -> list[Any]:
    node_affinity: Any = spec
    for key in ("affinity", "nodeAffinity", _REQUIRED):
        node_affinity = node_affinity.get(key) if isinstance(node_affinity, dict) else None
    terms = node_affinity.get("nodeSelectorTerms") if isinstance(node_affinity, dict) else None
    return terms if isinstance(terms, list) else []
