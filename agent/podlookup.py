"""Read a pod's identity and fracgpu assignment from the Kubernetes API."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from fracgpu import region_volume
from fracgpu.names import ANNOTATION_ASSIGNMENT, ANNOTATION_QUEUED, PRIORITY_ANNOTATIONS

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
    # The containers that mount their region volume exactly as the webhook writes it
    # (fracgpu.region_volume): where their shim keeps its accounting region.
    region_containers: frozenset[str] = frozenset()


class PodLookup(Protocol):
    def get(self, namespace: str, name: str) -> PodInfo: ...


class KubernetesPodLookup:
    """Reads pods with the ``kubernetes`` client (get on pods in any namespace)."""

    def __init__(self, core_api: Any) -> None:
        self._api = core_api
        # Client models back to the API's JSON, which fracgpu.region_volume is written in.
        self._as_json = core_api.api_client.sanitize_for_serialization

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
            region_containers=_region_containers(self._as_json(pod.spec)),
        )


def _region_containers(spec: Mapping[str, Any]) -> frozenset[str]:
    """The containers of a pod spec (as the API's JSON) that mount their region volume at the
    region's directory, exactly as the webhook writes both."""
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    return frozenset(c["name"] for c in containers if region_volume.own_mount_index(c, spec) >= 0)
