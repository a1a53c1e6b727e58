# Hand-written types for the generated deviceplugin_v1beta1_pb2_grpc module.
import grpc

from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2 as pb

class RegistrationStub:
    def __init__(self, channel: grpc.Channel) -> None: ...
    def Register(
        self, request: pb.RegisterRequest, timeout: float | None = None
    ) -> pb.Empty: ...

class RegistrationServicer:
    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty: ...

def add_RegistrationServicer_to_server(
    servicer: RegistrationServicer, server: grpc.Server
) -> None: ...

class DevicePluginStub:
    def __init__(self, channel: grpc.Channel) -> None: ...
    def GetDevicePluginOptions(
        self, request: pb.Empty, timeout: float | None = None
    ) -> pb.DevicePluginOptions: ...
    def ListAndWatch(
        self, request: pb.Empty, timeout: float | None = None
    ) -> grpc.CallIterator[pb.ListAndWatchResponse]: ...
    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, timeout: float | None = None
    ) -> pb.PreferredAllocationResponse: ...
    def Allocate(
        self, request: pb.AllocateRequest, timeout: float | None = None
    ) -> pb.AllocateResponse: ...
    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, timeout: float | None = None
    ) -> pb.PreStartContainerResponse: ...

class DevicePluginServicer:
    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions: ...
    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> object: ...
    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse: ...
    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse: ...
    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse: ...

def add_DevicePluginServicer_to_server(
    servicer: DevicePluginServicer, server: grpc.Server
) -> None: ...
