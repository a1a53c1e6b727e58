"""What happens on the host when kubelet allocates and starts a fracgpu container.

Allocate: a fresh per-allocation directory, and for a queued pod its GPUs in the env
(agent.queuedelivery). PreStartContainer: find the one container holding these device IDs
(kubelet pod-resources), read its pod's assignment, check a queued pod's container is the
one Allocate served, and write the limits file into every allocation directory of that
container (a container holding both canonical resources has one per resource; kubelet
mounts one of them, so both must agree).
"""

import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from agent.deviceplugin.units import ResourceKind
from agent.hostfiles import AllocationFiles, allocation_key
from agent.limits import AllocatedTokens, LimitsError, limits_for, render_limits
from agent.podlookup import PodInfo, PodLookup, PodLookupError
from agent.podresources import ContainerDevices, PodResourcesError, find_holder
from agent.queuedelivery import QueueDelivery, QueueDeliveryError
from fracgpu.model import GPUDevice
from fracgpu.names import CONTAINER_REGION_DIR, REGION_VOLUME_MEDIUM, region_volume_name
from fracgpu.shim_abi import Limits

log = logging.getLogger(__name__)


class ContainerStartError(Exception):
    """The container's limits could not be written; kubelet fails the start with this."""


class PodResourcesSource(Protocol):
    def list(self) -> list[ContainerDevices]: ...


class ContainerStarter:
    def __init__(
        self,
        *,
        node_name: str,
        resources: Iterable[str],
        pod_resources: PodResourcesSource,
        pods: PodLookup,
        files: AllocationFiles,
        gpus: Callable[[], dict[str, GPUDevice]],
        lookup_attempts: int,
        lookup_interval_seconds: float,
        delivery: QueueDelivery,
        context_overhead_bytes: int,
    ) -> None:
        self._node = node_name
        self._resources = tuple(resources)
        self._pod_resources = pod_resources
        self._pods = pods
        self._files = files
        self._gpus = gpus
        self._attempts = max(1, lookup_attempts)
        self._interval = lookup_interval_seconds
        self._delivery = delivery
        self._context_overhead = context_overhead_bytes

    def allocation_prepared(
        self, resource: str, kind: ResourceKind, device_ids: Iterable[str]
    ) -> tuple[str, dict[str, str]]:
        """(allocation key, env for the container): a fresh directory, and a queued pod's
        GPUs when the allocation is for one."""
        ids = list(device_ids)
        key = allocation_key(resource, ids)
        self._files.prepare(key)
        try:
            return key, self._delivery.allocate_env(resource, kind, key, ids)
        except (QueueDeliveryError, OSError) as error:
            raise ContainerStartError(str(error)) from None

    def container_starting(self, resource: str, device_ids: Iterable[str]) -> Limits:
        ids = list(device_ids)
        holder = self._identify(resource, ids)
        try:
            pod = self._pods.get(holder.namespace, holder.pod)
            compute, memory = self._resources
            allocated = AllocatedTokens(
                compute=len(holder.devices.get(compute, ())),
                memory_blocks=len(holder.devices.get(memory, ())),
            )
            limits = limits_for(
                pod,
                holder.container,
                self._node,
                self._gpus(),
                allocated,
                context_overhead_bytes=self._context_overhead,
            )
        except (PodLookupError, LimitsError) as error:
            raise ContainerStartError(str(error)) from None
        keys = {
            name: allocation_key(name, held)
            for name, held in holder.devices.items()
            if name in self._resources
        }
        self._check_region_volume(pod, holder.container, keys.values())
        try:
            self._delivery.check_start(
                namespace=holder.namespace,
                pod=holder.pod,
                uid=pod.uid,
                container=holder.container,
                queued=pod.queued,
                visible_devices=",".join(d.uuid for d in limits.devices),
                keys=keys,
            )
        except QueueDeliveryError as error:
            raise ContainerStartError(str(error)) from None
        content = render_limits(limits)
        try:
            for key in sorted(keys.values()):
                self._files.write_limits(key, content)
        except OSError as error:
            raise ContainerStartError(f"cannot write the limits file: {error}") from None
        log.info(
            "limits written",
            extra={
                "namespace": holder.namespace,
                "pod": holder.pod,
                "container": holder.container,
                "gpus": [d.uuid for d in limits.devices],
            },
        )
        return limits

    def _check_region_volume(self, pod: PodInfo, container: str, keys: Iterable[str]) -> None:
        """The container's shim keeps its region in its region volume, which fracgpu's
        webhook adds: without it (a pod admitted before fracgpu did) its CUDA calls would
        fail. A container an older agent started (a restart: kubelet keeps what Allocate
        returned then) has its region in the run dir that agent mounted."""
        if container in pod.region_containers:
            return
        if any(self._files.run_dir(key).is_dir() for key in keys):
            return
        raise ContainerStartError(
            f"pod {pod.namespace}/{pod.name}: container {container} has no fracgpu region "
            f"volume ({region_volume_name(container)}, an emptyDir of medium "
            f"{REGION_VOLUME_MEDIUM} at {CONTAINER_REGION_DIR}), which fracgpu's mutating "
            "webhook gives every GPU container: it was admitted before fracgpu added them, or "
            "past the webhook. Delete the pod and create it again"
        )

    def _identify(self, resource: str, ids: list[str]) -> ContainerDevices:
        last_error = ""
        for attempt in range(self._attempts):
            if attempt:
                time.sleep(self._interval)
            try:
                holder = find_holder(self._pod_resources.list(), resource, ids)
            except PodResourcesError as error:
                last_error = str(error)
                continue
            if holder is not None:
                return holder
            last_error = "no container holds exactly these device IDs yet"
        raise ContainerStartError(
            f"cannot tell which container holds {len(ids)} {resource} device(s): {last_error}"
        )
