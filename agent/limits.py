"""From a pod's assignment to the content of one container's limits file.

The decision (which GPUs, how much memory and compute) is the webhook's, read from the
pod's assignment annotation; this module checks it against this node and builds the
shim's ``Limits``. The file format itself belongs to ``fracgpu.shim_abi``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fracgpu.codec import decode_assignment
from fracgpu.dialects import canonical_counts
from fracgpu.errors import CodecError
from fracgpu.model import ContainerAssignment, GPUDevice, Priority, virtual_memory_mib
from fracgpu.names import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_PRIORITY,
    CORES_PER_GPU,
    HAMI_ANNOTATION_PRIORITY,
)
from fracgpu.shim_abi import (
    DEFAULT_CONTEXT_OVERHEAD_BYTES,
    DEFAULT_PRIORITY,
    PRIORITY_HIGH,
    PRIORITY_LOW,
    DeviceLimits,
    Limits,
    encode_limits,
)

if TYPE_CHECKING:  # only a type here: importing it loads the Kubernetes client (0.4 s)
    from agent.podlookup import PodInfo

MIB = 1024 * 1024


class LimitsError(Exception):
    """The pod's assignment cannot be turned into limits; says what is wrong."""


# Priority annotation values, fracgpu's words and HAMi's numbers; fracgpu's wins when both.
_PRIORITY_WORDS = (
    (ANNOTATION_PRIORITY, {"high": PRIORITY_HIGH, "low": PRIORITY_LOW}),
    (HAMI_ANNOTATION_PRIORITY, {"0": PRIORITY_HIGH, "1": PRIORITY_LOW}),
)


_PRIORITY_LEVELS = {Priority.HIGH: PRIORITY_HIGH, Priority.LOW: PRIORITY_LOW}


def _priority(pod: PodInfo, where: str) -> int:
    for key, values in _PRIORITY_WORDS:
        raw = pod.priority.get(key)
        if raw is None:
            continue
        if raw not in values:
            raise LimitsError(
                f"{where}: annotation {key}={raw!r} is not allowed: use {' or '.join(values)}"
            )
        return values[raw]
    return DEFAULT_PRIORITY


@dataclass(frozen=True)
class AllocatedTokens:
    """How many compute and memory device IDs kubelet allocated the container."""

    compute: int
    memory_blocks: int


# The most device memory a CUDA context can be counted for (--context-overhead-bytes).
MAX_CONTEXT_OVERHEAD_BYTES = 4 << 30


def limits_for(
    pod: PodInfo,
    container: str,
    node_name: str,
    gpus: dict[str, GPUDevice],
    allocated: AllocatedTokens | None = None,
    *,
    context_overhead_bytes: int = DEFAULT_CONTEXT_OVERHEAD_BYTES,
) -> Limits:
    """The container's limits from its pod's assignment, checked against this node and, when
    given, against the device IDs kubelet allocated it (so an assignment written past the
    webhook, e.g. through pods/status, cannot claim more than the container was counted)."""
    where = f"pod {pod.namespace}/{pod.name} container {container}"
    if pod.assignment is None:
        raise LimitsError(
            f"{where} holds fracgpu resources but has no {ANNOTATION_ASSIGNMENT} annotation: "
            "GPU pods must be admitted by the fracgpu webhook"
        )
    try:
        assignment = decode_assignment(pod.assignment)
    except CodecError as error:
        raise LimitsError(f"{where}: {error}") from None
    if assignment.node != node_name:
        raise LimitsError(
            f"{where} is assigned to node {assignment.node}, but this is node {node_name}"
        )
    chosen = assignment.for_container(container)
    if chosen is None:
        raise LimitsError(f"{where} holds fracgpu resources but the assignment has no entry for it")
    if allocated is not None:
        _check_allocated(where, chosen, allocated)
    devices = []
    whole = True
    best_effort = False
    all_cores = True
    for alloc in chosen.devices:
        gpu = gpus.get(alloc.uuid)
        if gpu is None:
            raise LimitsError(
                f"{where} is assigned GPU {alloc.uuid}, which this node does not have"
            )
        if alloc.memory_mib <= 0:
            raise LimitsError(f"{where} has no memory on GPU {alloc.uuid}: memoryMiB must be > 0")
        # Past the physical memory (memory scaling) the shim serves the slice from host memory.
        memory_mib = min(
            alloc.memory_mib, virtual_memory_mib(gpu.memory_mib, assignment.memory_scaling)
        )
        whole = whole and alloc.cores >= CORES_PER_GPU and memory_mib == gpu.memory_mib
        all_cores = all_cores and alloc.cores >= CORES_PER_GPU
        # cores 0 is best effort: no compute reserved, so none is limited either.
        best_effort = best_effort or alloc.cores == 0
        core_limit = alloc.cores if alloc.cores > 0 else CORES_PER_GPU
        devices.append(
            DeviceLimits(
                uuid=alloc.uuid,
                memory_limit_bytes=memory_mib * MIB,
                core_limit=core_limit,
                # vcuda-core-limit: idle compute up to this bound while alone on the GPU.
                core_limit_max=_elastic_bound(chosen.core_limit, core_limit),
            )
        )
    # The container's own priority (HAMi's limit) wins over the pod's annotations.
    priority = _PRIORITY_LEVELS[chosen.priority] if chosen.priority else _priority(pod, where)
    try:
        limits = Limits(
            devices=tuple(devices),
            whole=whole,
            namespace=pod.namespace,
            pod=pod.name,
            container=container,
            pod_uid=pod.uid or None,
            compute_limit_enabled=(
                assignment.compute_limit and not whole and not best_effort and not all_cores
            ),
            priority=priority,
            # Memory scaling: past the physical memory, the slice is served from host memory.
            memory_host_fallback=assignment.memory_scaling > 1.0,
            # The driver's own memory for each context (primary or created) the container
            # makes: counted in the slice, so contexts cannot take memory outside it.
            context_overhead_bytes=context_overhead_bytes,
        )
        encode_limits(limits)  # the shim's own checks, so a bad file is never written
    except CodecError as error:
        raise LimitsError(f"{where}: {error}") from None
    return limits


def _check_allocated(where: str, chosen: ContainerAssignment, allocated: AllocatedTokens) -> None:
    cores, blocks = canonical_counts(chosen)
    if (cores, blocks) != (allocated.compute, allocated.memory_blocks):
        raise LimitsError(
            f"{where}: its assignment holds {cores} cores and {blocks} memory blocks, but "
            f"kubelet allocated it {allocated.compute} and {allocated.memory_blocks}: the "
            "assignment was not written for this container's resources, refusing to start it"
        )


def _elastic_bound(core_limit_max: int | None, core_limit: int) -> int | None:
    if core_limit_max is None or core_limit_max <= core_limit:
        return None
    return core_limit_max


def render_limits(limits: Limits) -> str:
    """The limits file text, as the shim ABI encodes it."""
    return encode_limits(limits).decode()
