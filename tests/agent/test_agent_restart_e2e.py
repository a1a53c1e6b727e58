"""Fault: the agent is SIGKILLed and started again while fracgpu containers run.

Everything real except the GPU: the agent as a process (its own identity, the chart's RBAC)
on the NVML double, the test kubelet over gRPC, a webhook replica on a real kube-apiserver,
and a "container" that is a real process running under the shim (test build, on the CUDA
double) with the limits file and region directory the agent handed to kubelet.

What must survive the restart: the container's limits file (same bytes, mode 0444, same
inode), its accounting (region counters unchanged, further allocations still refused at
the slice), its metrics (the new agent reports the same usage), its files (housekeeping
of the new agent removes only the directories of a container that ended meanwhile), kubelet
(the new agent registers again and starts a new container with its limits), and the
GPUNode (devices as before; allocated equal to a recount from live pods).
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from agent.hostfiles import AllocationFiles, allocation_key
from fracgpu import codec, names
from fracgpu.model import Assignment
from fracgpu.shim_abi import RegionDevice, decode_limits, decode_region
from tests.agent.agent_process import AgentProcess
from tests.agent.kubelet import ContainerRef, TestKubelet
from tests.agent.nvml_double import SHIM_BUILD, NvmlDouble, ensure_shim_built
from tests.agent.regionvolume import region_in_volume
from tests.agent.test_node_e2e import agent_rbac  # noqa: F401 (fixture)
from tests.agent.waiting import wait_for
from tests.e2e.harness import ControlPlane, create_node, gpu_allocatable
from tests.e2e.harness.kube import body as kube_body
from tests.e2e.webhook_harness import running_webhooks
from tests.promtext import scrape

pytestmark = pytest.mark.e2e

GIB = 1 << 30
RESOURCES = (names.RESOURCE_VCUDA_CORE, names.RESOURCE_VCUDA_MEMORY)
WORKLOAD = SHIM_BUILD / "tests" / "mem_ops"
SHIM_TEST_LIBRARY = SHIM_BUILD / "libfracgpu-test.so"
# The restarted agent looks for stale directories often and gives them a grace far shorter
# than the running container's age, so its files survive only because the agent knows the
# container is live (a second still covers a directory kubelet is allocating right now).
RESTART_FLAGS = ("--stale-grace-seconds=1", "--housekeeping-seconds=0.5")


class Workload:
    """mem_ops under the shim: one output line per step; ``wait`` steps block on stdin."""

    def __init__(self, script: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(WORKLOAD), *script],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def next_steps(self, count: int, timeout: float = 20.0) -> list[list[str]]:
        out = []
        for _ in range(count):
            try:
                out.append(self._lines.get(timeout=timeout).split())
            except queue.Empty:
                raise AssertionError(f"workload stalled after {out}") from None
        return out

    def resume(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the last wait reads EOF: a normal exit
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@dataclass(frozen=True)
class Started:
    """A container the test kubelet started: its allocation keys and what it was handed."""

    ref: ContainerRef
    assignment: Assignment
    keys: tuple[str, ...]
    mounts: dict[str, str]
    region: Path  # in the container's region volume


@dataclass(frozen=True)
class FileState:
    content: bytes
    mode: int
    inode: int


def file_state(path: Path) -> FileState:
    st = path.stat()
    return FileState(path.read_bytes(), st.st_mode & 0o777, st.st_ino)


def region_device(path: Path) -> RegionDevice:
    (device,) = decode_region(path.read_bytes()).devices
    return device


def container_series(name: str, started: Started) -> str:
    (alloc,) = started.assignment.allocations()
    ref = started.ref
    labels = (
        f'container="{ref.container}",gpu="{alloc.uuid}",'
        f'namespace="{ref.namespace}",pod="{ref.pod}"'
    )
    return f"{name}{{{labels}}}"


def gpunode_status(custom: Any, node: str) -> dict[str, Any]:
    try:
        obj = custom.get_cluster_custom_object(
            names.GROUP, names.CRD_VERSION, names.GPUNODE_PLURAL, node
        )
    except ApiException:
        return {}
    return dict(obj.get("status") or {})


def recount(core: kubernetes.client.CoreV1Api, node: str) -> dict[str, tuple[int, int]]:
    """Per GPU of ``node``: (cores, memory MiB) summed over the live pods' assignments."""
    sums: dict[str, tuple[int, int]] = {}
    for item in core.list_pod_for_all_namespaces().items:
        meta = item.metadata
        assert meta is not None
        raw = (meta.annotations or {}).get(names.ANNOTATION_ASSIGNMENT)
        if raw is None or meta.deletion_timestamp is not None:
            continue
        assignment = codec.decode_assignment(raw)
        if assignment.node != node:
            continue
        for alloc in assignment.allocations():
            cores, memory = sums.get(alloc.uuid, (0, 0))
            sums[alloc.uuid] = (cores + alloc.cores, memory + alloc.memory_mib)
    return sums


def accounting_differences(custom: Any, core: kubernetes.client.CoreV1Api, node: str) -> list[str]:
    """How the GPUNode status differs from a recount from live pods (empty: equal)."""
    status = gpunode_status(custom, node)
    live = recount(core, node)
    published = {a["uuid"]: (a["cores"], a["memoryMiB"]) for a in status.get("allocated", [])}
    devices = [d["uuid"] for d in status.get("devices", [])]
    differences = []
    if status.get("reservations"):
        differences.append(f"reservations left: {status['reservations']}")
    if not devices:
        differences.append("no devices published")
    for gpu in devices:
        if published.get(gpu, (0, 0)) != live.get(gpu, (0, 0)):
            differences.append(f"{gpu}: published {published.get(gpu)} != live {live.get(gpu)}")
    return differences


class Node:
    """One GPU node: the NVML double, the test kubelet, the API objects, the agent."""

    def __init__(
        self,
        control_plane: ControlPlane,
        kube_client: kubernetes.client.ApiClient,
        directory: Path,
    ) -> None:
        self.name = f"restart-{uuid.uuid4().hex[:6]}"
        self.directory = directory
        self.control_plane = control_plane
        self.core = kubernetes.client.CoreV1Api(kube_client)
        self.custom = kubernetes.client.CustomObjectsApi(kube_client)
        self.double = NvmlDouble(directory)
        self.double.configure(
            device_count=2, device__0__memory_bytes=24 * GIB, device__1__memory_bytes=24 * GIB
        )
        create_node(
            kube_client,
            self.name,
            extended=gpu_allocatable(2, 24576),
            labels={"fracgpu.io/test-node": self.name},
        )
        self.kubelet = TestKubelet(directory / "dp", directory / "pr.sock")
        self.kubelet.start()
        self.files = AllocationFiles(directory / "state")
        self.pods: list[tuple[str, str]] = []
        self.agent = self.start_agent()

    def start_agent(self, *extra: str) -> AgentProcess:
        return AgentProcess(
            node=self.name,
            directory=self.directory,
            double=self.double,
            kubeconfig=self.control_plane.kubeconfig("agent"),
            publish_inventory=True,
            extra=extra,
        )

    def admit(self, namespace: str, pod: str, cores: int, memory_blocks: int) -> Assignment:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod},
            "spec": {
                "nodeSelector": {"fracgpu.io/test-node": self.name},
                "containers": [
                    {
                        "name": "main",
                        "image": "cuda:12",
                        "resources": {
                            "limits": {
                                names.RESOURCE_VCUDA_CORE: str(cores),
                                names.RESOURCE_VCUDA_MEMORY: str(memory_blocks),
                            }
                        },
                    }
                ],
            },
        }

        def created() -> Any:
            try:  # until the webhook's caches hold the Node and its GPUNode it denies
                return self.core.create_namespaced_pod(namespace, kube_body(body))
            except ApiException as error:
                if error.status in (400, 403, 500):
                    return None
                raise

        admitted = wait_for(created, f"admission of {pod} onto {self.name}")
        self.pods.append((namespace, pod))
        raw = admitted.metadata.annotations[names.ANNOTATION_ASSIGNMENT]
        assignment = codec.decode_assignment(raw)
        assert assignment.node == self.name
        return assignment

    def start_container(self, namespace: str, pod: str, cores: int, memory_blocks: int) -> Started:
        """Kubelet's part: allocate both canonical resources, then PreStartContainer."""
        assignment = self.admit(namespace, pod, cores, memory_blocks)
        ref = ContainerRef(namespace, pod, "main")
        keys: list[str] = []
        mounts: dict[str, str] = {}
        for resource, count in zip(RESOURCES, (cores, memory_blocks), strict=True):
            ids, reply = self.kubelet.allocate(ref, resource, count)
            keys.append(allocation_key(resource, ids))
            if not mounts:  # kubelet mounts one allocation's files; take the first
                mounts = {m.container_path: m.host_path for m in reply.mounts}
        for resource in RESOURCES:
            self.kubelet.pre_start(ref, resource)
        return Started(ref, assignment, tuple(keys), mounts, self.region_of(namespace, pod))

    def region_of(self, namespace: str, pod: str) -> Path:
        uid = self.core.read_namespaced_pod(pod, namespace).metadata.uid
        return region_in_volume(self.agent.pods_dir, uid, "main")

    def run_under_shim(self, started: Started, script: list[str]) -> Workload:
        env = {
            **os.environ,
            **self.double.env(),
            "LD_PRELOAD": str(SHIM_TEST_LIBRARY),
            "FRACGPU_TEST_LIMITS_PATH": started.mounts[names.CONTAINER_LIMITS_PATH],
            "FRACGPU_TEST_REGION_PATH": str(started.region),
            "FRACGPU_TEST_NODE_DIR": str(self.directory / "node-boards"),
        }
        return Workload(script, env)

    def published_devices(self) -> list[dict[str, Any]]:
        return list(gpunode_status(self.custom, self.name).get("devices") or [])

    def close(self) -> None:
        self.agent.stop()
        self.kubelet.close()
        for namespace, pod in self.pods:
            _unless_gone(self.core.delete_namespaced_pod, pod, namespace, grace_period_seconds=0)
        _unless_gone(
            self.custom.delete_cluster_custom_object,
            names.GROUP,
            names.CRD_VERSION,
            names.GPUNODE_PLURAL,
            self.name,
        )
        _unless_gone(self.core.delete_node, self.name)


def _unless_gone(delete: Callable[..., object], *args: str, **kwargs: int) -> None:
    try:
        delete(*args, **kwargs)
    except ApiException as error:
        if error.status != 404:
            raise


@pytest.fixture
def node(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    agent_rbac: None,  # noqa: F811 (the imported fixture)
    short_dir: Path,
) -> Iterator[Node]:
    ensure_shim_built()
    # One webhook replica as its own service account: it places pods and, as leader, keeps
    # the GPUNode's allocated summary equal to the live pods.
    with running_webhooks(
        kube_client,
        control_plane.kubeconfig("webhook"),
        short_dir,
        ["--reservation-ttl-seconds", "15"],
        replicas=1,
    ):
        gpu_node = Node(control_plane, kube_client, short_dir)
        try:
            yield gpu_node
        finally:
            gpu_node.close()


def test_sigkilled_agent_comes_back_without_disturbing_running_containers(
    node: Node, namespace: str
) -> None:
    devices = wait_for(node.published_devices, "the agent's GPUNode")
    index_of = {d["uuid"]: d["index"] for d in devices}

    # Two containers: "kept" runs through the restart, "ended" ends while the agent is down.
    kept = node.start_container(namespace, "kept", cores=30, memory_blocks=16)  # 4 GiB
    ended = node.start_container(namespace, "ended", cores=20, memory_blocks=8)
    (slice_,) = kept.assignment.allocations()
    assert slice_.memory_mib == 4096
    limits_paths = [node.files.limits_path(k) for k in kept.keys]
    written = decode_limits(limits_paths[0].read_bytes())
    assert (written.pod, written.devices[0].uuid) == ("kept", slice_.uuid)
    files_before = [file_state(p) for p in limits_paths]
    assert {f.mode for f in files_before} == {0o444}
    assert files_before[0].content == files_before[1].content

    workload = node.run_under_shim(
        kept,
        ["ctx", str(index_of[slice_.uuid]), "alloc", "3Gi", "wait", "alloc", "2Gi", "alloc",
         "1Gi", "wait"],
    )  # fmt: skip
    try:
        assert workload.next_steps(3) == [["ctx", "0"], ["alloc", "0", "0"], ["waiting"]]
        region = kept.region
        before = region_device(region)
        assert (before.memory_used, before.memory_limit) == (3 * GIB, 4 * GIB)
        used = container_series("fracgpu_container_memory_used_bytes", kept)
        limit = container_series("fracgpu_container_memory_limit_bytes", kept)
        first_scrape = scrape(node.agent.metrics_port())
        assert (first_scrape[used], first_scrape[limit]) == (3 * GIB, 4 * GIB)
        wait_for(
            lambda: not accounting_differences(node.custom, node.core, node.name),
            "GPUNode allocated equal to a recount with both pods",
        )

        # SIGKILL: no shutdown code runs, the sockets stay behind.
        node.agent.proc.kill()
        assert node.agent.stop() == -9
        registrations = len(node.kubelet.registrations)
        # Meanwhile "ended" ends: kubelet frees its devices, its pod goes from the API.
        node.kubelet.release(ended.ref)
        node.core.delete_namespaced_pod("ended", namespace, grace_period_seconds=0)
        assert region_device(region) == before  # nothing touched the running accounting

        node.agent = node.start_agent(*RESTART_FLAGS)
        wait_for(
            lambda: len(node.kubelet.registrations) >= registrations + 2,
            "both device plugins registered again",
        )
        for resource in RESOURCES:
            conn = node.kubelet.wait_for_plugin(resource, timeout=30)
            assert conn.devices and set(conn.devices.values()) == {"Healthy"}

        # The new agent's housekeeping removes the ended container's directories, and
        # only those.
        wait_for(
            lambda: not any(node.files.directory(k).exists() for k in ended.keys),
            "the ended container's directories removed",
            timeout=30,
        )
        assert [file_state(p) for p in limits_paths] == files_before
        assert region_device(region) == before
        restarted_scrape = scrape(node.agent.metrics_port())
        assert (restarted_scrape[used], restarted_scrape[limit]) == (3 * GIB, 4 * GIB)
        assert not any('pod="ended"' in series for series in restarted_scrape)

        # The new agent serves kubelet: a container started now gets its limits.
        late = node.start_container(namespace, "late", cores=10, memory_blocks=4)
        (late_slice,) = late.assignment.allocations()
        late_limits = decode_limits(node.files.limits_path(late.keys[0]).read_bytes())
        assert (late_limits.pod, late_limits.devices[0].uuid) == ("late", late_slice.uuid)

        # The running process keeps its slice: 2 GiB more would pass it, 1 GiB fits.
        workload.resume()
        assert workload.next_steps(3) == [["alloc", "2", "-1"], ["alloc", "0", "1"], ["waiting"]]
        after = region_device(region)
        assert (after.memory_used, after.oom_rejections) == (4 * GIB, before.oom_rejections + 1)
        oom = container_series("fracgpu_container_oom_rejections_total", kept)
        last_scrape = scrape(node.agent.metrics_port())
        assert (last_scrape[used], last_scrape[oom]) == (4 * GIB, after.oom_rejections)

        # The GPUNode: the same devices, and allocated equal to a recount from live pods.
        assert node.published_devices() == devices
        differences: list[str] = []

        def settled() -> bool:
            differences[:] = accounting_differences(node.custom, node.core, node.name)
            return not differences

        try:
            wait_for(settled, "GPUNode allocated equal to a recount after the restart")
        except AssertionError as error:
            raise AssertionError(f"{error}: {differences}") from None
        expected: dict[str, tuple[int, int]] = {}
        for alloc in (slice_, late_slice):
            cores, memory = expected.get(alloc.uuid, (0, 0))
            expected[alloc.uuid] = (cores + alloc.cores, memory + alloc.memory_mib)
        assert recount(node.core, node.name) == expected
        assert [file_state(p) for p in limits_paths] == files_before
    finally:
        workload.finish()
    assert workload.proc.returncode == 0
