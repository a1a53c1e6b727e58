"""From a pod's assignment to the text of one container's limits file.

The decision (which GPUs, how much memory and compute) is the webhook's, read from the
pod's assignment annotation; this module checks it against this node and hands it to the
shim ABI encoder (``fracgpu.shim_abi``), the one owner of the file format.
"""

from dataclasses import dataclass

from agent import shim_abi_adapter
from agent.podlookup import PodInfo
from fracgpu.codec import decode_assignment
from fracgpu.errors import CodecError
from fracgpu.model import GPUDevice
from fracgpu.names import ANNOTATION_ASSIGNMENT, CORES_PER_GPU

MIB = 1024 * 1024


class LimitsError(Exception):
    """The pod's assignment cannot be turned into limits; says what is wrong."""


@dataclass(frozen=True)
class DeviceLimit:
    uuid: str
    memory_limit_bytes: int
    # Percent of the GPU's compute (1..100); None when the container has no compute share
    # (best effort), which turns compute limiting off.
    core_limit: int | None


@dataclass(frozen=True)
class ContainerLimits:
    namespace: str
    pod: str
    container: str
    pod_uid: str
    whole: bool
    devices: tuple[DeviceLimit, ...]

    @property
    def compute_limit_enabled(self) -> bool:
        return not self.whole and all(d.core_limit is not None for d in self.devices)


def limits_for(
    pod: PodInfo, container: str, node_name: str, gpus: dict[str, GPUDevice]
) -> ContainerLimits:
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
    devices = []
    whole = True
    for alloc in chosen.devices:
        gpu = gpus.get(alloc.uuid)
        if gpu is None:
            raise LimitsError(
                f"{where} is assigned GPU {alloc.uuid}, which this node does not have"
            )
        if alloc.memory_mib <= 0:
            raise LimitsError(f"{where} has no memory on GPU {alloc.uuid}: memoryMiB must be > 0")
        memory_mib = min(alloc.memory_mib, gpu.memory_mib)
        whole = whole and alloc.cores >= CORES_PER_GPU and memory_mib >= gpu.memory_mib
        devices.append(
            DeviceLimit(
                uuid=alloc.uuid,
                memory_limit_bytes=memory_mib * MIB,
                core_limit=alloc.cores if alloc.cores > 0 else None,
            )
        )
    return ContainerLimits(
        namespace=pod.namespace,
        pod=pod.name,
        container=container,
        pod_uid=pod.uid,
        whole=whole,
        devices=tuple(devices),
    )


def render_limits(limits: ContainerLimits) -> str:
    """The limits file text, encoded by the shim ABI module."""
    return shim_abi_adapter.encode_limits(limits)
