"""Queue mode at the device plugin: a queued pod's GPUs reach its containers at Allocate.

A queued pod is created before its GPUs are chosen, and a container's env cannot change
after creation, so NVIDIA_VISIBLE_DEVICES travels in the Allocate response instead of the
pod spec. Allocate does not say which pod it is for. It is told apart by what only the pod
kubelet is admitting now has:

- bound to this node, queued, its assignment present and naming this node, Pending, not
  being deleted;
- taken in by kubelet (pod-resources lists it: kubelet adds a pod before admitting it, and
  admits pods one at a time, so pods bound later are not listed yet);
- a container that has not started, holds none of this resource yet, was not served
  before (a record on disk, so an agent restart keeps it), and whose assignment holds as
  many tokens of this resource as kubelet is allocating.

Several pods can still fit: a pod kubelet refused at admission stays listed, and looks
Pending until its status reaches the API. Such a pod was taken in before the one being
admitted now (kubelet adds a pod, then admits it, then takes the next one, in bind order
and, within one batch, creation order), so the pod bound last is served (ties: created
last), in kubelet's container order. A tenant cannot steer that: its own refused pod is
older than any pod admitted after it. What was served is
recorded next to the allocation, and PreStartContainer checks that the container kubelet
starts with these device IDs is the one served (``check_start``): a mismatch refuses the
start rather than run a container on a GPU chosen for another.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

from agent.deviceplugin.units import ResourceKind
from agent.hostfiles import AllocationFiles
from agent.nodepods import NodePod, NodePods, NodePodsError, PodContainer
from agent.podresources import KnownPods, PodResourcesError
from fracgpu.codec import decode_assignment
from fracgpu.dialects import canonical_counts
from fracgpu.errors import CodecError
from fracgpu.names import ENV_VISIBLE_DEVICES
from fracgpu.visible_devices import visible_devices_value

log = logging.getLogger(__name__)

_WAITING_PHASES = ("Pending", "")


class QueueDeliveryError(Exception):
    """A queued pod's GPUs cannot be delivered (or were delivered to another container)."""


@dataclass(frozen=True)
class Served:
    """Which queued pod's container an allocation's device IDs were served to, and with
    which GPUs."""

    resource: str
    namespace: str
    pod: str
    uid: str
    container: str
    visible_devices: str

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Served | None:
        try:
            fields = json.loads(data)
            return cls(**{k: str(fields[k]) for k in cls.__dataclass_fields__})
        except (ValueError, TypeError, KeyError):
            return None

    def names(self) -> str:
        return f"pod {self.namespace}/{self.pod} container {self.container}"


@dataclass(frozen=True)
class Candidate:
    pod: NodePod
    container: PodContainer
    visible_devices: str


def _taken_in_last_first(pods: Iterable[NodePod]) -> list[NodePod]:
    """Bound last first, then created last; a pod without a bind time (the API writes one
    at bind, so not a pod kubelet should be admitting) after all others."""
    pods = list(pods)
    bound = sorted(
        (p for p in pods if p.scheduled_at),
        key=lambda p: (p.scheduled_at, p.created_at, p.namespace, p.name),
        reverse=True,
    )
    return bound + [p for p in pods if not p.scheduled_at]


def candidates(
    *,
    node: str,
    resource: str,
    kind: ResourceKind,
    count: int,
    pods: Iterable[NodePod],
    known: KnownPods | None,
    served: set[tuple[str, str, str]],
) -> list[Candidate]:
    """The containers an Allocate of ``count`` IDs of ``resource`` may be for, at most one
    per pod (its first unserved one, kubelet's order), pods bound last first. ``known``
    None: pod-resources could not be read, so that filter is left out. ``served``:
    (pod uid, container, resource) already served."""
    found = []
    for pod in _taken_in_last_first(pods):
        if not pod.queued or pod.assignment is None or pod.deleting:
            continue
        if pod.phase not in _WAITING_PHASES:
            continue
        held_by = known.get((pod.namespace, pod.name)) if known is not None else {}
        if held_by is None:
            continue  # bound, but kubelet has not taken it in yet: not the one admitted now
        try:
            assignment = decode_assignment(pod.assignment)
        except CodecError:
            continue  # its start is refused with the decoding error (limits_for)
        if assignment.node != node:
            continue
        for container in pod.containers:
            if container.started or resource in held_by.get(container.name, frozenset()):
                continue
            if (pod.uid, container.name, resource) in served:
                continue
            chosen = assignment.for_container(container.name)
            if chosen is None:
                continue
            cores, blocks = canonical_counts(chosen)
            if (cores if kind is ResourceKind.COMPUTE else blocks) != count:
                continue
            found.append(Candidate(pod, container, visible_devices_value(chosen)))
            break
    return found


class QueueDelivery:
    def __init__(
        self,
        *,
        node_name: str,
        pods: NodePods,
        known_pods: Callable[[], KnownPods],
        files: AllocationFiles,
    ) -> None:
        self._node = node_name
        self._pods = pods
        self._known_pods = known_pods
        self._files = files
        # Both plugins' Allocates must not pick the same container for one resource twice.
        self._lock = threading.Lock()

    def allocate_env(
        self, resource: str, kind: ResourceKind, key: str, device_ids: list[str]
    ) -> dict[str, str]:
        """The env for this allocation: a queued pod's GPUs, or {} (immediate mode: the pod
        spec carries them). Records what it served under ``key``."""
        with self._lock:
            known: KnownPods | None
            try:
                known, problem = self._known_pods(), ""
            except PodResourcesError as error:
                known, problem = None, str(error)
            try:
                pods = self._pods.on_node(self._node)
                listed = {(p.namespace, p.name) for p in pods}
                if known is None or not known.keys() <= listed:
                    # kubelet knows a pod the API's cache does not show bound here yet
                    # (likely the one it admits now): read from etcd instead.
                    pods = self._pods.on_node(self._node, fresh=True)
            except NodePodsError as error:
                # Immediate-mode pods must not depend on this list; a queued pod served
                # without its GPUs is refused at PreStartContainer (no record).
                log.warning("queued pods not checked", extra={"error": str(error)})
                return {}
            found = candidates(
                node=self._node,
                resource=resource,
                kind=kind,
                count=len(device_ids),
                pods=pods,
                known=known,
                served=self._served(),
            )
            if not found:
                return {}
            if known is None:
                raise QueueDeliveryError(
                    f"{resource}: cannot tell which queued pod kubelet is admitting: {problem}"
                )
            chosen = found[0]
            pod, container = chosen.pod, chosen.container.name
            where = f"queued pod {pod.namespace}/{pod.name} container {container}"
            if len(found) > 1:
                log.warning(
                    "several queued pods fit this allocation; serving the one bound last",
                    extra={
                        "resource": resource,
                        "pods": [f"{c.pod.namespace}/{c.pod.name}" for c in found],
                    },
                )
            if chosen.container.visible_devices_override:
                raise QueueDeliveryError(
                    f"{where}: {chosen.container.visible_devices_override}; a queued pod's "
                    f"GPUs come from the device plugin, and its own {ENV_VISIBLE_DEVICES} "
                    "would replace them"
                )
            record = Served(
                resource=resource,
                namespace=chosen.pod.namespace,
                pod=chosen.pod.name,
                uid=chosen.pod.uid,
                container=chosen.container.name,
                visible_devices=chosen.visible_devices,
            )
            self._files.write_served(key, record.encode())
        log.info(
            "queued pod served",
            extra={"resource": resource, "pod": where, "gpus": chosen.visible_devices},
        )
        return {ENV_VISIBLE_DEVICES: chosen.visible_devices}

    def _served(self) -> set[tuple[str, str, str]]:
        out = set()
        for key in self._files.all_keys():
            data = self._files.read_served(key)
            record = Served.decode(data) if data is not None else None
            if record is not None:
                out.add((record.uid, record.container, record.resource))
        return out

    def check_start(
        self,
        *,
        namespace: str,
        pod: str,
        uid: str,
        container: str,
        queued: bool,
        visible_devices: str,
        keys: Mapping[str, str],
    ) -> None:
        """At PreStartContainer: the container kubelet starts (``keys``: resource ->
        allocation key of what it holds) is the one Allocate served, with these GPUs."""
        here = f"pod {namespace}/{pod} container {container}"
        for resource, key in sorted(keys.items()):
            data = self._files.read_served(key)
            record = Served.decode(data) if data is not None else None
            if data is not None and record is None:
                raise QueueDeliveryError(
                    f"{here}: the served record of its {resource} is unreadable"
                )
            if not queued:
                if record is not None:
                    raise QueueDeliveryError(
                        f"{here} holds {resource} devices that Allocate served to queued "
                        f"{record.names()} (GPUs {record.visible_devices}): refusing to start "
                        "it with another pod's GPUs; delete the pod to have it allocated afresh"
                    )
                continue
            if record is None:
                raise QueueDeliveryError(
                    f"{here} is a queued pod, but Allocate did not serve it its GPUs for "
                    f"{resource} (the agent could not tell it was the pod being admitted): "
                    "refusing to start it without them; delete the pod to have it "
                    "allocated afresh"
                )
            if (record.namespace, record.pod, record.uid, record.container) != (
                namespace,
                pod,
                uid,
                container,
            ):
                raise QueueDeliveryError(
                    f"{here} holds {resource} devices that Allocate served to {record.names()}"
                    f" (GPUs {record.visible_devices}): refusing to start it on a GPU chosen "
                    "for another container; delete the pod to have it allocated afresh"
                )
            if record.visible_devices != visible_devices:
                raise QueueDeliveryError(
                    f"{here} was served GPUs {record.visible_devices} but its assignment now "
                    f"names {visible_devices}: refusing to start it on GPUs its limits are not for"
                )
