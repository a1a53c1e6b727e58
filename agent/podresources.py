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


class PodResourcesClient:
    def __init__(self, socket: Path, timeout_seconds: float = 5.0) -> None:
        self._socket = socket
        self._timeout = timeout_seconds

    def list(self) -> list[ContainerDevices]:
        try:
            with grpc.insecure_channel(f"unix://{self._socket}") as channel:
                reply = pb_grpc.PodResourcesListerStub(channel).List(
                    pb.ListPodResourcesRequest(), timeout=self._timeout
                )
        except grpc.RpcError as error:
            raise PodResourcesError(
                f"kubelet pod-resources List on {self._socket} failed: "
                f"{error.code().name}: {error.details()}"
            ) from None
        out = []
        for pod in reply.pod_resources:
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
