"""One kubelet device plugin (v1beta1) for one canonical resource."""

import logging
from collections.abc import Iterator

import grpc

from agent.boardfiles import BoardFiles, BoardNameError
from agent.containerstart import ContainerStarter, ContainerStartError
from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2 as pb
from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from agent.deviceplugin.state import DeviceState
from agent.deviceplugin.units import ResourceKind, advertised_units, gpu_of, preferred
from agent.hostfiles import AllocationFiles
from agent.shim_install import InstalledShim
from fracgpu.names import (
    CONTAINER_LIBRARY_PATH,
    CONTAINER_LIMITS_PATH,
    CONTAINER_NODE_DIR,
    CONTAINER_PRELOAD_PATH,
)

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# ListAndWatch wakes at least this often to notice a closed stream.
_STREAM_POLL_SECONDS = 1.0


class DevicePlugin(pb_grpc.DevicePluginServicer):
    def __init__(
        self,
        *,
        kind: ResourceKind,
        resource_name: str,
        state: DeviceState,
        starter: ContainerStarter,
        files: AllocationFiles,
        shim: InstalledShim,
        boards: BoardFiles,
    ) -> None:
        self.kind = kind
        self.resource_name = resource_name
        self._state = state
        self._starter = starter
        self._files = files
        self._shim = shim
        self._boards = boards
        # Bumped to end the open ListAndWatch streams (server restart, shutdown).
        self._generation = 0

    def end_streams(self) -> None:
        self._generation += 1
        self._state.wake()

    def GetDevicePluginOptions(  # noqa: N802 (gRPC method name)
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=True, get_preferred_allocation_available=True
        )

    def _devices_message(self) -> tuple[int, pb.ListAndWatchResponse]:
        version, devices, health, memory_scaling = self._state.snapshot()
        units = advertised_units(self.kind, devices, health, memory_scaling)
        return version, pb.ListAndWatchResponse(
            devices=[pb.Device(ID=u.id, health=HEALTHY if u.healthy else UNHEALTHY) for u in units]
        )

    def ListAndWatch(  # noqa: N802 (gRPC method name)
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        generation = self._generation
        version, message = self._devices_message()
        log.info("ListAndWatch opened", extra={"resource": self.resource_name})
        yield message
        context.add_callback(self._state.wake)
        while context.is_active() and generation == self._generation:
            seen = self._state.wait_for_change(version, _STREAM_POLL_SECONDS)
            if seen != version and context.is_active() and generation == self._generation:
                version, message = self._devices_message()
                yield message

    def GetPreferredAllocation(  # noqa: N802 (gRPC method name)
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        responses = []
        for req in request.container_requests:
            ids = preferred(
                self.kind,
                list(req.available_deviceIDs),
                list(req.must_include_deviceIDs),
                req.allocation_size,
            )
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(  # noqa: N802 (gRPC method name)
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        known = self._state.gpus()
        responses = []
        for req in request.container_requests:
            ids = list(req.devices_ids)
            unknown = [d for d in ids if gpu_of(self.kind, d) not in known]
            if not ids or unknown:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{self.resource_name}: unknown device IDs {unknown[:3]}; "
                    f"expected IDs advertised by this plugin (<gpu-uuid>-{self.kind.value}-<n>)",
                )
            try:
                # Boards first: nothing is prepared for a container that cannot start.
                boards = self._board_mounts(ids)
                key, envs = self._starter.allocation_prepared(self.resource_name, self.kind, ids)
            except ContainerStartError as error:
                log.error(
                    "allocation refused",
                    extra={"resource": self.resource_name, "error": str(error)},
                )
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
            responses.append(
                pb.ContainerAllocateResponse(
                    # Only for a queued pod: its GPUs, chosen after the pod was created.
                    envs=envs,
                    # No region directory: the region is in the pod's own memory, the
                    # region volume the mutating webhook gives each GPU container.
                    mounts=[
                        pb.Mount(
                            container_path=CONTAINER_LIBRARY_PATH,
                            host_path=str(self._shim.library),
                            read_only=True,
                        ),
                        pb.Mount(
                            container_path=CONTAINER_PRELOAD_PATH,
                            host_path=str(self._shim.preload),
                            read_only=True,
                        ),
                        pb.Mount(
                            container_path=CONTAINER_LIMITS_PATH,
                            host_path=str(self._files.limits_path(key)),
                            read_only=True,
                        ),
                        *boards,
                    ],
                )
            )
            log.info(
                "allocated",
                extra={"resource": self.resource_name, "devices": len(ids), "key": key},
            )
        return pb.AllocateResponse(container_responses=responses)

    def _board_mounts(self, ids: list[str]) -> list[pb.Mount]:
        """Priority and burst-when-alone need the node's view of each of the container's
        GPUs: their boards, which only the agent writes, read-only; never another GPU's
        (whose boards would tell when its tenants launch work)."""
        mounts = []
        gpus = {gpu_of(self.kind, d) for d in ids}  # every ID known: checked by the caller
        for uuid in sorted(u for u in gpus if u is not None):
            try:
                board = self._boards.ensure(uuid)
            except (OSError, BoardNameError) as error:
                raise ContainerStartError(
                    f"cannot make the priority board of GPU {uuid} in "
                    f"{self._boards.node_dir}: {error}"
                ) from None
            mounts.append(
                pb.Mount(
                    container_path=f"{CONTAINER_NODE_DIR}/{uuid}",
                    host_path=str(board),
                    read_only=True,
                )
            )
        return mounts

    def PreStartContainer(  # noqa: N802 (gRPC method name)
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        try:
            self._starter.container_starting(self.resource_name, request.devices_ids)
        except ContainerStartError as error:
            log.error(
                "container start refused",
                extra={"resource": self.resource_name, "error": str(error)},
            )
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        return pb.PreStartContainerResponse()
