"""Read a pod's identity and fracgpu assignment from the Kubernetes API."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from fracgpu.names import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_QUEUED,
    CONTAINER_REGION_DIR,
    PRIORITY_ANNOTATIONS,
    REGION_VOLUME_MEDIUM,
    region_volume_name,
)

# The pod annotations the node side reads besides the assignment (fracgpu.names: one list,
# which the chart's update matchCondition must cover).
_READ_ANNOTATIONS = PRIORITY_ANNOTATIONS

# Part of kubelet's 30 s PreStartContainer budget.
_TIMEOUT_SECONDS = 5


class PodLookupError(Exception):
    """The pod could not be read from the API; says which pod and why."""


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    node_name: str
    assignment: str | None  # the raw annotation, decoded by the caller
    # Compute priority annotations as written (fracgpu.io/priority, nvidia.com/priority).
    priority: Mapping[str, str] = field(default_factory=dict)
    # Queue mode: its GPUs reach the containers through Allocate (agent.queuedelivery).
    queued: bool = False
    # The containers that mount their region volume (fracgpu.names.region_volume_name) at
    # the region's directory: where their shim keeps its accounting region.
    region_containers: frozenset[str] = frozenset()


class PodLookup(Protocol):
    def get(self, namespace: str, name: str) -> PodInfo: ...


class KubernetesPodLookup:
    """Reads pods with the ``kubernetes`` client (get on pods in any namespace)."""

    def __init__(self, core_api: Any) -> None:
        self._api = core_api

    def get(self, namespace: str, name: str) -> PodInfo:
        try:
            pod = self._api.read_namespaced_pod(name, namespace, _request_timeout=_TIMEOUT_SECONDS)
        except ApiException as error:
            raise PodLookupError(
                f"cannot read pod {namespace}/{name}: {error.status} {error.reason}"
            ) from None
        except (HTTPError, OSError) as error:  # API unreachable or too slow
            raise PodLookupError(
                f"cannot read pod {namespace}/{name}: the API did not answer ({error})"
            ) from None
        annotations = pod.metadata.annotations or {}
        return PodInfo(
            namespace=namespace,
            name=name,
            uid=str(pod.metadata.uid or ""),
            node_name=str(pod.spec.node_name or ""),
            assignment=annotations.get(ANNOTATION_ASSIGNMENT),
            priority={k: annotations[k] for k in _READ_ANNOTATIONS if k in annotations},
            queued=ANNOTATION_QUEUED in annotations,
            region_containers=_region_containers(pod.spec),
        )


def _region_containers(spec: Any) -> frozenset[str]:
    """The containers of a pod spec (a client model) mounting their memory-backed region
    volume at the region's directory, writable and whole, as the webhook writes it."""
    in_memory = {
        v.name
        for v in spec.volumes or ()
        if v.empty_dir is not None and v.empty_dir.medium == REGION_VOLUME_MEDIUM
    }
    return frozenset(
        c.name
        for c in [*(spec.init_containers or ()), *(spec.containers or ())]
        if any(
            m.name == region_volume_name(c.name)
            and m.name in in_memory
            and m.mount_path == CONTAINER_REGION_DIR
            and not (m.read_only or m.sub_path or m.sub_path_expr)
            for m in c.volume_mounts or ()
        )
    )
