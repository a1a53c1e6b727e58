"""Which pod and container hold which device IDs, from kubelet's pod-resources API (v1).

Kubelet records a container's devices when it allocates them, before it starts the
container, so at PreStartContainer time exactly one container lists the device IDs
kubelet just passed in. That is the identification; nothing is guessed from pod age.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from agent.deviceplugin.proto import podresources_v1_pb2 as pb
from agent.deviceplugin.proto import podresources_v1_pb2_grpc as pb_grpc


class PodResourcesError(Exception):
    """Kubelet's pod-resources API could not be asked; says which socket and why."""


@dataclass(frozen=True)
class ContainerDevices:
    namespace: str
    pod: str
    container: str
    # resource name -> device IDs
    devices: dict[str, frozenset[str]]


# (namespace, pod) -> container -> the resources it holds devices of
KnownPods = dict[tuple[str, str], dict[str, frozenset[str]]]


class PodResourcesClient:
    def __init__(self, socket: Path, timeout_seconds: float = 5.0) -> None:
        self._socket = socket
        self._timeout = timeout_seconds

    def _reply(self) -> pb.ListPodResourcesResponse:
        try:
            with grpc.insecure_channel(f"unix://{self._socket}") as channel:
                reply: pb.ListPodResourcesResponse = pb_grpc.PodResourcesListerStub(channel).List(
                    pb.ListPodResourcesRequest(), timeout=self._timeout
                )
        except grpc.RpcError as error:
            raise PodResourcesError(
                f"kubelet pod-resources List on {self._socket} failed: "
                f"{error.code().name}: {error.details()}"
            ) from None
        return reply

    def known_pods(self) -> KnownPods:
        """Every pod kubelet has taken in (including the one it is admitting now: kubelet
        adds a pod to its pod manager before admitting it), with what each container holds."""
        return {
            (pod.namespace, pod.name): {
                container.name: frozenset(
                    group.resource_name for group in container.devices if group.device_ids
                )
                for container in pod.containers
            }
            for pod in self._reply().pod_resources
        }

    def list(self) -> list[ContainerDevices]:
        """The containers holding devices, with their device IDs per resource."""
        out = []
        for pod in self._reply().pod_resources:
            for container in pod.containers:
                devices: dict[str, set[str]] = {}
                for group in container.devices:
                    devices.setdefault(group.resource_name, set()).update(group.device_ids)
                if devices:
                    out.append(
                        ContainerDevices(
                            pod.namespace,
                            pod.name,
                            container.name,
                            {r: frozenset(ids) for r, ids in devices.items()},
                        )
                    )
        return out


def find_holder(
    containers: Iterable[ContainerDevices], resource: str, device_ids: Iterable[str]
) -> ContainerDevices | None:
    """The one container whose devices of ``resource`` are exactly ``device_ids``."""
    wanted = frozenset(device_ids)
    matches = [c for c in containers if c.devices.get(resource) == wanted]
    return matches[0] if len(matches) == 1 else None
