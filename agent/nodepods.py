"""The pods bound to this node, as queue-mode Allocate needs them to tell which one kubelet
is admitting: identity, queue annotation, assignment, phase, bind time and containers.

Read as raw JSON (one list with a field selector on spec.nodeName, as kubelet itself
watches its pods; from the API server's watch cache, indexed by node, unless ``fresh``
asks for a read from etcd) and parsed defensively: every field here is tenant-written or
tenant-influenced, so a malformed pod is read as "not a candidate", never as an error.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from fracgpu.names import ANNOTATION_ASSIGNMENT, ANNOTATION_QUEUED
from fracgpu.visible_devices import visible_devices_override

_TIMEOUT_SECONDS = 5


class NodePodsError(Exception):
    """The node's pods could not be listed; says why."""


@dataclass(frozen=True)
class PodContainer:
    name: str
    # Why the container's own env could set NVIDIA_VISIBLE_DEVICES ("" when it cannot).
    visible_devices_override: str
    started: bool  # kubelet reported it running or terminated at least once


@dataclass(frozen=True)
class NodePod:
    namespace: str
    name: str
    uid: str
    queued: bool
    assignment: str | None
    phase: str
    deleting: bool
    # RFC 3339 times as the API writes them (one format: they sort as strings).
    scheduled_at: str
    created_at: str
    # Init containers first, then the others: the order kubelet allocates devices in.
    containers: tuple[PodContainer, ...]


class NodePods(Protocol):
    def on_node(self, node_name: str, *, fresh: bool = False) -> list[NodePod]: ...


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _started(status: Mapping[str, Any]) -> set[str]:
    names = set()
    for field in ("initContainerStatuses", "containerStatuses"):
        for entry in map(_dict, _list(status.get(field))):
            state, last = _dict(entry.get("state")), _dict(entry.get("lastState"))
            if {"running", "terminated"} & (state.keys() | last.keys()):
                names.add(_text(entry.get("name")))
    return names


def _scheduled_at(status: Mapping[str, Any]) -> str:
    for condition in map(_dict, _list(status.get("conditions"))):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return _text(condition.get("lastTransitionTime"))
    return ""


def parse_node_pod(pod: Mapping[str, Any]) -> NodePod | None:
    """One pod from the API's JSON; None when it lacks a name or namespace."""
    meta, spec, status = (
        _dict(pod.get("metadata")),
        _dict(pod.get("spec")),
        _dict(pod.get("status")),
    )
    namespace, name = _text(meta.get("namespace")), _text(meta.get("name"))
    if not namespace or not name:
        return None
    annotations = _dict(meta.get("annotations"))
    assignment = annotations.get(ANNOTATION_ASSIGNMENT)
    started = _started(status)
    containers = tuple(
        PodContainer(
            name=_text(container.get("name")),
            visible_devices_override=visible_devices_override(container),
            started=_text(container.get("name")) in started,
        )
        for field in ("initContainers", "containers")
        for container in map(_dict, _list(spec.get(field)))
    )
    return NodePod(
        namespace=namespace,
        name=name,
        uid=_text(meta.get("uid")),
        queued=ANNOTATION_QUEUED in annotations,
        assignment=assignment if isinstance(assignment, str) else None,
        phase=_text(status.get("phase")),
        deleting=meta.get("deletionTimestamp") is not None,
        scheduled_at=_scheduled_at(status),
        created_at=_text(meta.get("creationTimestamp")),
        containers=containers,
    )


class KubernetesNodePods:
    """Lists a node's pods with the ``kubernetes`` client (list on pods, all namespaces)."""

    def __init__(self, core_api: Any) -> None:
        self._api = core_api

    def on_node(self, node_name: str, *, fresh: bool = False) -> list[NodePod]:
        """The node's pods. Not ``fresh``: resourceVersion 0, served from the API server's
        cache (no etcd read of every pod in the cluster), which may lag a little."""
        try:
            response = self._api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node_name}",
                **({} if fresh else {"resource_version": "0"}),
                _preload_content=False,
                _request_timeout=_TIMEOUT_SECONDS,
            )
            body = json.loads(response.data)
        except ApiException as error:
            raise NodePodsError(
                f"cannot list the pods of node {node_name}: {error.status} {error.reason}"
            ) from None
        except (HTTPError, OSError, ValueError) as error:
            raise NodePodsError(
                f"cannot list the pods of node {node_name}: the API did not answer ({error})"
            ) from None
        pods = (parse_node_pod(_dict(item)) for item in _list(_dict(body).get("items")))
        return [pod for pod in pods if pod is not None]
