# Hand-written types for the generated podresources_v1_pb2_grpc module.
import grpc

from agent.deviceplugin.proto import podresources_v1_pb2 as pb

class PodResourcesListerStub:
    def __init__(self, channel: grpc.Channel) -> None: ...
    def List(
        self, request: pb.ListPodResourcesRequest, timeout: float | None = None
    ) -> pb.ListPodResourcesResponse: ...
    def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, timeout: float | None = None
    ) -> pb.AllocatableResourcesResponse: ...

class PodResourcesListerServicer:
    def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse: ...
    def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pb.AllocatableResourcesResponse: ...

def add_PodResourcesListerServicer_to_server(
    servicer: PodResourcesListerServicer, server: grpc.Server
) -> None: ...
