"""Fixtures for the agent tests: short socket directories, GPUs, pods, a test kubelet."""

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.boardfiles import BoardFiles
from agent.containerstart import ContainerStarter
from agent.deviceplugin.plugin import DevicePlugin
from agent.deviceplugin.server import PluginManager
from agent.deviceplugin.state import DeviceState
from agent.deviceplugin.units import ResourceKind
from agent.hostfiles import AllocationFiles
from agent.nodepods import NodePod
from agent.nvml_backend import PynvmlBackend
from agent.podlookup import PodInfo, PodLookupError
from agent.podresources import PodResourcesClient
from agent.queuedelivery import QueueDelivery
from agent.shim_install import InstalledShim, install_shim
from fracgpu.codec import encode_assignment
from fracgpu.model import Assignment, ContainerAssignment, GPUAllocation, GPUDevice
from fracgpu.names import RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY
from tests.agent.kubelet import TestKubelet
from tests.agent.nvml_double import NvmlDouble
from tests.agent.regionvolume import region_in_volume

NODE = "gpu-node-1"


@pytest.fixture
def backend(double: NvmlDouble) -> Iterator[PynvmlBackend]:
    """The agent's real NVML client on the double the test module configures (``double``)."""
    nvml = PynvmlBackend()
    yield nvml
    nvml.shutdown()


GPU_A = GPUDevice("GPU-aaaaaaaa-0000-0000-0000-000000000001", 0, "NVIDIA A10", 24576)
GPU_B = GPUDevice(
    "GPU-bbbbbbbb-0000-0000-0000-000000000002",
    1,
    "NVIDIA A10",
    24576,
    pci_bus_id="00000000:02:00.0",
)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths must stay under 108 bytes, so not under pytest's tmp_path."""
    path = Path(tempfile.mkdtemp(prefix="fgag-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class PodTable:
    """The pods the API would return (the agent reads them through the PodLookup and
    NodePods seams); a queued pod also carries how the node's pod list shows it."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], PodInfo] = {}
        self.node_pods: dict[tuple[str, str], NodePod] = {}
        # What the API server's cache shows when it lags (None: the same as node_pods).
        self.stale_node_pods: dict[tuple[str, str], NodePod] | None = None
        self.lists: list[bool] = []  # each list of the node's pods: fresh or not

    def add(self, pod: PodInfo, on_node: NodePod | None = None) -> None:
        self.pods[(pod.namespace, pod.name)] = pod
        if on_node is not None:
            self.node_pods[(pod.namespace, pod.name)] = on_node

    def on_node(self, node_name: str, *, fresh: bool = False) -> list[NodePod]:
        self.lists.append(fresh)
        pods = self.stale_node_pods if self.stale_node_pods is not None and not fresh else None
        if pods is None:
            pods = self.node_pods
        return list(pods.values()) if node_name == NODE else []

    def get(self, namespace: str, name: str) -> PodInfo:
        try:
            return self.pods[(namespace, name)]
        except KeyError:
            raise PodLookupError(f"cannot read pod {namespace}/{name}: 404 Not Found") from None


def assigned_pod(
    name: str,
    containers: dict[str, list[GPUAllocation]],
    namespace: str = "team-a",
    *,
    memory_scaling: float = 1.0,
) -> PodInfo:
    assignment = Assignment(
        node=NODE,
        reservation_id=f"r-{name}",
        containers=tuple(ContainerAssignment(c, tuple(devs)) for c, devs in containers.items()),
        memory_scaling=memory_scaling,
    )
    return PodInfo(
        namespace,
        name,
        f"uid-{name}",
        NODE,
        encode_assignment(assignment),
        region_containers=frozenset(containers),
    )


@dataclass
class AgentRig:
    kubelet: TestKubelet
    manager: PluginManager
    state: DeviceState
    files: AllocationFiles
    shim: InstalledShim
    pods: PodTable
    dirs: dict[str, Path] = field(default_factory=dict)

    def region(self, pod: PodInfo, container: str) -> Path:
        """Where the container's shim keeps its region: its region volume, as kubelet makes
        it for the pod."""
        return region_in_volume(self.dirs["pods"], pod.uid, container)


def fake_shim_library(path: Path, payload: bytes = b"v1") -> Path:
    """An ELF-looking file standing in for libfracgpu.so (install only copies bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF" + payload)
    return path


@pytest.fixture
def rig(short_dir: Path) -> Iterator[AgentRig]:
    plugin_dir = short_dir / "dp"
    plugin_dir.mkdir()
    kubelet = TestKubelet(plugin_dir, short_dir / "pr.sock")
    kubelet.start()
    state = DeviceState([GPU_A, GPU_B])
    files = AllocationFiles(short_dir / "state", short_dir / "pods")
    node_dir = short_dir / "node"
    boards = BoardFiles(node_dir)
    boards.prepare()
    shim = install_shim(fake_shim_library(short_dir / "image" / "libfracgpu.so"), short_dir / "lib")
    pods = PodTable()
    resources = (RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY)
    pod_resources = PodResourcesClient(short_dir / "pr.sock")
    delivery = QueueDelivery(
        node_name=NODE, pods=pods, known_pods=pod_resources.known_pods, files=files
    )
    starter = ContainerStarter(
        node_name=NODE,
        resources=resources,
        pod_resources=pod_resources,
        pods=pods,
        files=files,
        gpus=state.gpus,
        lookup_attempts=3,
        lookup_interval_seconds=0.05,
        delivery=delivery,
        context_overhead_bytes=0,
    )
    plugins = [
        DevicePlugin(
            kind=kind,
            resource_name=resource,
            state=state,
            starter=starter,
            files=files,
            shim=shim,
            boards=boards,
        )
        for kind, resource in zip(
            (ResourceKind.COMPUTE, ResourceKind.MEMORY), resources, strict=True
        )
    ]
    manager = PluginManager(plugins, state, plugin_dir, poll_seconds=0.1)
    manager.start()
    try:
        dirs = {"plugin": plugin_dir, "pods": short_dir / "pods", "node": node_dir}
        yield AgentRig(kubelet, manager, state, files, shim, pods, dirs)
    finally:
        manager.stop()
        kubelet.close()
        boards.close()
