"""What a pod asks of placement: GPU containers, CPU and memory, model/UUID constraints, policy.

CPU and memory follow Kubernetes' effective pod request: the larger of the app containers
(plus sidecars) and the peak of the init phase, plus the pod overhead. A container that
sets only a limit requests its limit, as the API server defaults it.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from fracgpu import names
from fracgpu.dialects import (
    DialectConfig,
    gpu_resource_values,
    parse_container,
    with_pod_core_limit,
)
from fracgpu.errors import FracgpuError, QuantityError
from fracgpu.model import ContainerRequest
from fracgpu.placement import Constraints, PodDemand, Policy
from fracgpu.quantity import parse_quantity, shown
from webhook.rules import pod as podlib

# Annotation -> the Constraints field it feeds; fracgpu's own and HAMi's names combine.
_CONSTRAINT_ANNOTATIONS: Final = {
    names.ANNOTATION_USE_MODELS: "include_models",
    names.HAMI_ANNOTATION_USE_GPUTYPE: "include_models",
    names.ANNOTATION_AVOID_MODELS: "exclude_models",
    names.HAMI_ANNOTATION_NOUSE_GPUTYPE: "exclude_models",
    names.HAMI_ANNOTATION_USE_GPUUUID: "include_uuids",
    names.HAMI_ANNOTATION_NOUSE_GPUUUID: "exclude_uuids",
}
MAX_CONSTRAINT_ENTRIES: Final = 256  # GPU UUIDs in one annotation
# Model names in one annotation, and characters in one name. Real names are short ("NVIDIA
# H100 80GB HBM3" has 21) and a pod names a few; the bounds keep what each pod's shape holds
# (the workload model remembers it, refused pods too) small.
MAX_MODEL_NAMES: Final = 32
MAX_MODEL_NAME_LENGTH: Final = 64
_HOST_KEYS_ORDERED: Final = ("cpu", "memory")
_HOST_KEYS: Final = frozenset(_HOST_KEYS_ORDERED)
_ZERO: Final = Fraction(0)
_ANYWHERE: Final = Constraints()


class DemandError(FracgpuError):
    """An annotation or resource that placement cannot use; the message says what is allowed."""


@dataclass(frozen=True, slots=True)
class PodAsk:
    """A pod's GPU ask; ``demand`` is None when no container asks for a GPU."""

    requests: tuple[ContainerRequest, ...]
    demand: PodDemand | None
    policy: Policy


def gpu_requests(pod: Mapping[str, Any], config: DialectConfig) -> tuple[ContainerRequest, ...]:
    """Canonical requests of every GPU container (init containers included)."""
    found = []
    for _, _, container in podlib.containers(pod):
        request = parse_container(container, config)
        if request is not None:
            found.append(request)
    return tuple(found)


def gpu_container_names(pod: Mapping[str, Any], config: DialectConfig) -> list[str]:
    """Containers that carry any GPU resource, in whatever form (fracgpu's canonical one too).

    Used on pods fracgpu already rewrote: canonical totals of multi-GPU shares (2 x 70 cores
    = 140) are not valid requests to parse again, and need not be: the assignment is the
    record, checked against the reservation.
    """
    return [c["name"] for _, _, c in podlib.containers(pod) if gpu_resource_values(c, config)]


def read_ask(pod: Mapping[str, Any], config: DialectConfig, default_policy: Policy) -> PodAsk:
    annotations = podlib.annotations(pod)
    requests = with_pod_core_limit(gpu_requests(pod, config), annotations, config)
    policy = _policy(annotations, default_policy)
    if not requests:
        return PodAsk((), None, policy)
    check_priority(annotations)
    node_name = podlib.spec(pod).get("nodeName")
    if node_name:
        raise DemandError(
            f"spec.nodeName={node_name!r} is not allowed on a GPU pod: it bypasses the scheduler "
            "and fracgpu's placement. Remove it; fracgpu pins the pod to the node it chooses "
            f"(steer with {names.ANNOTATION_USE_MODELS} or {names.HAMI_ANNOTATION_USE_GPUUUID})"
        )
    cpu_milli, memory_mib = cpu_and_memory(pod)
    demand = PodDemand(requests, cpu_milli, memory_mib, constraints(annotations))
    return PodAsk(requests, demand, policy)


def constraints(annotations: Mapping[str, str]) -> Constraints:
    if annotations.keys().isdisjoint(_CONSTRAINT_ANNOTATIONS):
        return _ANYWHERE  # most pods: one shared (frozen) value, not a new one per pod
    fields: dict[str, list[str]] = {}
    for key, target in _CONSTRAINT_ANNOTATIONS.items():
        if key not in annotations:
            continue
        raw = annotations[key]
        entries = [e.strip() for e in raw.split(",") if e.strip()]
        uuids = "uuid" in target
        most = MAX_CONSTRAINT_ENTRIES if uuids else MAX_MODEL_NAMES
        if not entries or len(entries) > most:
            raise DemandError(
                f"annotation {key}={shown(raw)!r} is not allowed: use a comma-separated "
                f"list of 1-{most} GPU "
                f"{'UUIDs' if uuids else 'model names such as A100,H100'}"
                + (f", not {len(entries)}" if entries else "")
            )
        if not uuids:
            for entry in entries:
                if len(entry) > MAX_MODEL_NAME_LENGTH:
                    raise DemandError(
                        f"annotation {key}={shown(raw)!r} is not allowed: a GPU model name "
                        f"has at most {MAX_MODEL_NAME_LENGTH} characters, "
                        f"{shown(entry)!r} has {len(entry)}"
                    )
        fields.setdefault(target, []).extend(entries)

    def unique(target: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(fields.get(target, [])))

    return Constraints(
        include_models=unique("include_models"),
        exclude_models=unique("exclude_models"),
        include_uuids=unique("include_uuids"),
        exclude_uuids=unique("exclude_uuids"),
    )


# Priority annotations: fracgpu's words and HAMi's numbers (0 = high, 1 = low).
_PRIORITY_VALUES: Final = {
    names.ANNOTATION_PRIORITY: ("high", "low"),
    names.HAMI_ANNOTATION_PRIORITY: ("0", "1"),
}


def check_priority(annotations: Mapping[str, str]) -> None:
    """The node side reads the priority annotations; reject values it could not read."""
    for key, allowed in _PRIORITY_VALUES.items():
        if key in annotations and annotations[key] not in allowed:
            raise DemandError(
                f"annotation {key}={annotations[key]!r} is not allowed: use {' or '.join(allowed)}"
            )


def _policy(annotations: Mapping[str, str], default: Policy) -> Policy:
    """fracgpu's own annotation, else HAMi's (node policy first: one policy here chooses the
    node and the GPU together), else the configured default."""
    for key, allowed in _POLICY_ANNOTATIONS:
        raw = annotations.get(key)
        if raw is None:
            continue
        if raw not in allowed:
            raise DemandError(
                f"annotation {key}={shown(raw)!r} is not allowed: use one of {', '.join(allowed)}"
            )
        return Policy(raw)
    return default


_POLICY_ANNOTATIONS: Final = (
    (names.ANNOTATION_POLICY, tuple(p.value for p in Policy)),
    (names.HAMI_ANNOTATION_NODE_POLICY, (Policy.BINPACK.value, Policy.SPREAD.value)),
    (names.HAMI_ANNOTATION_GPU_POLICY, (Policy.BINPACK.value, Policy.SPREAD.value)),
)


def cpu_and_memory(pod: Mapping[str, Any]) -> tuple[int, int]:
    """The pod's effective (CPU millicores, memory MiB) request, rounded up."""
    app = [_ZERO, _ZERO]
    init_peak = [_ZERO, _ZERO]
    sidecars = [_ZERO, _ZERO]
    counted = False
    for field, index, container in podlib.containers(pod):
        asked = _container_request(container, f".spec.{field}[{index}]")
        counted = counted or asked is not None
        cpu, memory = asked or (_ZERO, _ZERO)
        if field == podlib.CONTAINERS:
            if asked:
                app = [app[0] + cpu, app[1] + memory]
        elif container.get("restartPolicy") == "Always":  # a sidecar runs beside the app
            if asked:
                sidecars = [sidecars[0] + cpu, sidecars[1] + memory]
        else:
            init_peak = [
                max(init_peak[0], sidecars[0] + cpu),
                max(init_peak[1], sidecars[1] + memory),
            ]
    overhead_map = podlib.mapping_at(podlib.spec(pod), "overhead", ".spec")
    if not counted and not overhead_map:
        return 0, 0  # nothing asks for CPU or memory: no Fraction arithmetic on zeros
    overhead = _amounts(overhead_map, ".spec.overhead")
    cpu_total = max(app[0] + sidecars[0], init_peak[0]) + overhead[0]
    memory_total = max(app[1] + sidecars[1], init_peak[1]) + overhead[1]
    return math.ceil(cpu_total * 1000), math.ceil(memory_total / 2**20)


def _container_request(container: Mapping[str, Any], path: str) -> tuple[Fraction, Fraction] | None:
    """(CPU, memory) the container requests; None when it names neither (requests nothing)."""
    resources = podlib.mapping_at(container, "resources", path)
    limits_map = podlib.mapping_at(resources, "limits", path)
    requests_map = podlib.mapping_at(resources, "requests", path)
    if not _HOST_KEYS & (limits_map.keys() | requests_map.keys()):
        return None
    limits = _amounts(limits_map, f"{path}.resources.limits")
    requests = _amounts(requests_map, f"{path}.resources.requests")
    cpu = requests[0] if "cpu" in requests_map else limits[0]
    memory = requests[1] if "memory" in requests_map else limits[1]
    return cpu, memory


def _amounts(resources: Mapping[str, Any], path: str) -> tuple[Fraction, Fraction]:
    values = []
    for key in _HOST_KEYS_ORDERED:
        if key not in resources:
            values.append(_ZERO)
            continue
        raw = resources[key]
        try:
            value = parse_quantity(raw)
        except QuantityError as error:
            raise DemandError(f"{path}.{key}: {error}") from None
        if value < 0:
            raise DemandError(f"{path}.{key}={raw!r} is negative: use 0 or more")
        values.append(value)
    return values[0], values[1]
