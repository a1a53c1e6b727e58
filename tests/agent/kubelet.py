"""A test kubelet: the parts of kubelet a device plugin talks to, over real gRPC.

- Registration service on <dir>/kubelet.sock; on Register it dials the plugin's socket,
  asks for its options and keeps a ListAndWatch stream open, as kubelet does.
- Allocation like kubelet's device manager: GetPreferredAllocation over the healthy free
  IDs, Allocate, record the container's devices, then PreStartContainer.
- The pod-resources API (v1 List, GetAllocatableResources) on its own socket, answering
  from the recorded allocations and the pods taken in (``admit``: kubelet lists a pod from
  the moment it starts admitting it, its containers without devices until allocated).
- restart(): like a kubelet restart, removes every socket in the directory and serves a
  new kubelet.sock.
"""

import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2 as dp
from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from agent.deviceplugin.proto import podresources_v1_pb2 as pr
from agent.deviceplugin.proto import podresources_v1_pb2_grpc as pr_grpc


@dataclass
class PluginConnection:
    resource: str
    endpoint: Path
    options: dp.DevicePluginOptions
    channel: grpc.Channel
    stub: dp_grpc.DevicePluginStub
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    updates: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)


@dataclass(frozen=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str


class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, kubelet: "TestKubelet") -> None:
        self._kubelet = kubelet

    def Register(  # noqa: N802 (gRPC method name)
        self, request: dp.RegisterRequest, context: grpc.ServicerContext
    ) -> dp.Empty:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version")
        self._kubelet.registrations.append(request)
        # Kubelet connects back to the plugin after answering; do it on a thread like it does.
        threading.Thread(target=self._kubelet.connect, args=(request,), daemon=True).start()
        return dp.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: "TestKubelet") -> None:
        self._kubelet = kubelet

    def List(  # noqa: N802 (gRPC method name)
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        with self._kubelet.lock:
            for (namespace, name), names in self._kubelet.admitted.items():
                pods[(namespace, name)] = {c: {} for c in names}
            for (ref, resource), ids in self._kubelet.allocations.items():
                containers = pods.setdefault((ref.namespace, ref.pod), {})
                containers.setdefault(ref.container, {})[resource] = sorted(ids)
        return pr.ListPodResourcesResponse(
            pod_resources=[
                pr.PodResources(
                    namespace=ns,
                    name=name,
                    containers=[
                        pr.ContainerResources(
                            name=cname,
                            devices=[
                                pr.ContainerDevices(resource_name=r, device_ids=ids)
                                for r, ids in sorted(res.items())
                            ],
                        )
                        for cname, res in sorted(containers.items())
                    ],
                )
                for (ns, name), containers in sorted(pods.items())
            ]
        )

    def GetAllocatableResources(  # noqa: N802 (gRPC method name)
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        with self._kubelet.lock:
            return pr.AllocatableResourcesResponse(
                devices=[
                    pr.ContainerDevices(resource_name=c.resource, device_ids=sorted(c.devices))
                    for c in self._kubelet.plugins.values()
                ]
            )


class TestKubelet:
    __test__ = False  # not a pytest test class

    def __init__(self, plugin_dir: Path, pod_resources_socket: Path) -> None:
        self.plugin_dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self.lock = threading.Lock()
        self.registrations: list[dp.RegisterRequest] = []
        self.connect_errors: list[str] = []
        self.plugins: dict[str, PluginConnection] = {}
        self.allocations: dict[tuple[ContainerRef, str], list[str]] = {}
        self.allocate_responses: dict[tuple[ContainerRef, str], dp.ContainerAllocateResponse] = {}
        self.admitted: dict[tuple[str, str], list[str]] = {}
        self._server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dp_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        server.start()
        self._server = server
        if self._pr_server is None:
            pr_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), pr_server)
            pr_server.add_insecure_port(f"unix://{self.pod_resources_socket}")
            pr_server.start()
            self._pr_server = pr_server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        with self.lock:
            plugins = list(self.plugins.values())
            self.plugins.clear()
        for plugin in plugins:
            plugin.channel.close()

    def restart(self) -> None:
        """Kubelet restart: drop connections, delete every socket in the dir, serve again."""
        self.stop()
        for path in self.plugin_dir.iterdir():
            if path.is_socket():
                path.unlink()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._pr_server is not None:
            self._pr_server.stop(0).wait()
            self._pr_server = None

    # -- plugin side -----------------------------------------------------------------------
    def connect(self, request: dp.RegisterRequest) -> None:
        endpoint = self.plugin_dir / request.endpoint
        channel = grpc.insecure_channel(f"unix://{endpoint}")
        stub = dp_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(dp.Empty(), timeout=5)
        except (grpc.RpcError, ValueError) as error:
            # The plugin went away right after registering: kubelet drops it, so do we.
            self.connect_errors.append(f"{request.resource_name}: {error}")
            channel.close()
            return
        conn = PluginConnection(request.resource_name, endpoint, options, channel, stub)
        with self.lock:
            old = self.plugins.get(request.resource_name)
            self.plugins[request.resource_name] = conn
        if old is not None:
            old.channel.close()
        threading.Thread(target=self._watch, args=(conn,), daemon=True).start()

    def _watch(self, conn: PluginConnection) -> None:
        try:
            for message in conn.stub.ListAndWatch(dp.Empty()):
                with conn.changed:
                    conn.devices = {d.ID: d.health for d in message.devices}
                    conn.updates += 1
                    conn.changed.notify_all()
        except (grpc.RpcError, ValueError):
            pass  # plugin gone, or the channel closed by a kubelet stop

    def wait_for_plugin(self, resource: str, timeout: float = 10.0) -> PluginConnection:
        deadline = threading.Event()
        for _ in range(int(timeout / 0.05)):
            with self.lock:
                conn = self.plugins.get(resource)
            if conn is not None and conn.updates > 0:
                return conn
            deadline.wait(0.05)
        raise AssertionError(f"plugin for {resource} never registered and listed devices")

    def wait_for_update(self, resource: str, after: int, timeout: float = 10.0) -> dict[str, str]:
        conn = self.wait_for_plugin(resource)
        with conn.changed:
            if not conn.changed.wait_for(lambda: conn.updates > after, timeout=timeout):
                raise AssertionError(f"no ListAndWatch update for {resource}")
            return dict(conn.devices)

    # -- kubelet's device manager ----------------------------------------------------------
    def admit(self, namespace: str, pod: str, containers: list[str]) -> None:
        """Take a pod in, as kubelet does before admitting it (and so before Allocate)."""
        with self.lock:
            self.admitted[(namespace, pod)] = list(containers)

    def allocate(
        self, ref: ContainerRef, resource: str, count: int
    ) -> tuple[list[str], dp.ContainerAllocateResponse]:
        conn = self.wait_for_plugin(resource)
        with self.lock:
            used = {d for (_, r), ids in self.allocations.items() if r == resource for d in ids}
        with conn.changed:
            free = sorted(d for d, h in conn.devices.items() if h == "Healthy" and d not in used)
        if len(free) < count:
            raise RuntimeError(f"not enough {resource}: {len(free)} free, {count} wanted")
        ids = free[:count]
        if conn.options.get_preferred_allocation_available:
            preferred = conn.stub.GetPreferredAllocation(
                dp.PreferredAllocationRequest(
                    container_requests=[
                        dp.ContainerPreferredAllocationRequest(
                            available_deviceIDs=free, allocation_size=count
                        )
                    ]
                ),
                timeout=5,
            )
            ids = list(preferred.container_responses[0].deviceIDs)
        reply = conn.stub.Allocate(
            dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]),
            timeout=5,
        )
        with self.lock:
            self.allocations[(ref, resource)] = ids
            self.allocate_responses[(ref, resource)] = reply.container_responses[0]
        return ids, reply.container_responses[0]

    def pre_start(self, ref: ContainerRef, resource: str) -> None:
        conn = self.wait_for_plugin(resource)
        if not conn.options.pre_start_required:
            return
        with self.lock:
            ids = self.allocations[(ref, resource)]
        conn.stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=ids), timeout=30)

    def release(self, ref: ContainerRef) -> None:
        with self.lock:
            for key in [k for k in self.allocations if k[0] == ref]:
                del self.allocations[key]
