"""The node path end to end on a real kube-apiserver: the agent (a real process on the NVML
double) publishes its GPUNode, the real webhook places a pod on it, the test kubelet
allocates the pod's canonical resources from the agent's device plugins and starts the
container, and the limits file the agent wrote matches the pod's assignment."""

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from agent.hostfiles import AllocationFiles, allocation_key
from fracgpu import codec, names
from fracgpu.shim_abi import DeviceLimits, decode_limits
from tests.agent.agent_process import AgentProcess
from tests.agent.kubelet import ContainerRef, TestKubelet
from tests.agent.nvml_double import NvmlDouble, ensure_shim_built
from tests.agent.waiting import wait_for
from tests.chart.chartfiles import rbac_objects
from tests.e2e.harness import ControlPlane, create_node, gpu_allocatable
from tests.e2e.harness.identities import WEBHOOK_NAMESPACE
from tests.e2e.webhook_harness import (
    TcpBalancer,
    WebhookReplica,
    WebhookTLS,
    install_webhook_rbac,
    register_webhooks,
    unregister_webhooks,
    wait_placing,
)

pytestmark = pytest.mark.e2e

GIB = 1 << 30


@pytest.fixture
def webhook(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    tmp_path: Path,
) -> Iterator[WebhookReplica]:
    # fracgpu's namespace holds the replica's Lease; run alone, no other test made it
    install_webhook_rbac(kube_client)
    tls = WebhookTLS.create(tmp_path / "tls")
    replica = WebhookReplica("agent-e2e", control_plane.kubeconfig("admin"), tls, tmp_path).start()
    try:
        replica.wait_ready()
        wait_placing([replica])
        with TcpBalancer([replica.port]) as balancer:
            url = f"https://127.0.0.1:{balancer.port}"
            register_webhooks(kube_client, url, tls.ca_pem)
            try:
                yield replica
            finally:
                unregister_webhooks(kube_client, url, tls.ca_pem)
    finally:
        replica.stop()


@pytest.fixture
def agent_rbac(kube_client: kubernetes.client.ApiClient) -> Iterator[None]:
    """The chart's least-privilege RBAC for the agent's service account, and nothing more."""
    rbac = kubernetes.client.RbacAuthorizationV1Api(kube_client)
    objects = rbac_objects("agent", WEBHOOK_NAMESPACE, service_account="fracgpu-agent")
    created = []
    for obj in objects:
        create = {
            "ClusterRole": rbac.create_cluster_role,
            "ClusterRoleBinding": rbac.create_cluster_role_binding,
        }[obj["kind"]]
        try:
            create(obj)
        except ApiException as error:
            if error.status != 409:
                raise
        created.append(obj)
    yield
    for obj in reversed(created):
        delete = {
            "ClusterRole": rbac.delete_cluster_role,
            "ClusterRoleBinding": rbac.delete_cluster_role_binding,
        }[obj["kind"]]
        try:
            delete(obj["metadata"]["name"])
        except ApiException as error:
            if error.status != 404:
                raise


def _published_devices(custom: Any, node: str) -> list[dict[str, Any]]:
    try:
        obj = custom.get_cluster_custom_object(
            names.GROUP, names.CRD_VERSION, names.GPUNODE_PLURAL, node
        )
    except ApiException:
        return []
    return list((obj.get("status") or {}).get("devices") or [])


@pytest.mark.usefixtures("agent_rbac")
def test_agent_publishes_webhook_places_kubelet_starts_limits_match(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    webhook: WebhookReplica,
    namespace: str,
    short_dir: Path,
) -> None:
    ensure_shim_built()
    node = f"agent-node-{uuid.uuid4().hex[:6]}"
    double = NvmlDouble(short_dir)
    double.configure(
        device_count=2,
        device__0__memory_bytes=24 * GIB,
        device__1__memory_bytes=24 * GIB,
        # a CUDA context takes 256 MiB, which the agent measures at start-up (shared state:
        # its probe's libcuda and its own NVML see the same simulated hardware)
        state_file=str(short_dir / "gpu.state"),
        context_bytes=256 << 20,
    )
    create_node(kube_client, node, extended=gpu_allocatable(2, 24576))
    kubelet = TestKubelet(short_dir / "dp", short_dir / "pr.sock")
    kubelet.start()
    agent = AgentProcess(
        node=node,
        directory=short_dir,
        double=double,
        # the agent's own identity, limited to the chart's RBAC for it
        kubeconfig=control_plane.kubeconfig("agent"),
        publish_inventory=True,
        # every CUDA context of its containers counts what one took at start-up
        extra=("--context-overhead-bytes=auto",),
    )
    custom = kubernetes.client.CustomObjectsApi(kube_client)
    core = kubernetes.client.CoreV1Api(kube_client)
    try:
        devices = wait_for(
            lambda: _published_devices(custom, node), "the agent's GPUNode", timeout=30.0
        )
        assert [d["memoryMiB"] for d in devices] == [24576, 24576]
        uuids = {d["uuid"] for d in devices}
        # The node's own settings (GPUNode spec): twice its GPU memory offered, no compute
        # pacing. The pod below asks for more than a GPU's physical memory, so it can only be
        # admitted once the webhook has seen these.
        custom.patch_cluster_custom_object(
            names.GROUP,
            names.CRD_VERSION,
            names.GPUNODE_PLURAL,
            node,
            {"spec": {"memoryScaling": 2, "disableCoreLimit": True}},
        )

        # The webhook places a TKEStack-style pod on the agent's node (its caches may need a
        # moment to see the new GPUNode).
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "trainer"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "cuda:12",
                        "resources": {
                            "limits": {
                                names.RESOURCE_VCUDA_CORE: "30",
                                names.RESOURCE_VCUDA_CORE_LIMIT: "60",
                                # 128 x 256 MiB = 32 GiB on a 24 GiB GPU
                                names.RESOURCE_VCUDA_MEMORY: "128",
                            }
                        },
                    }
                ]
            },
        }

        denials: list[str] = []

        def admitted() -> Any:
            # Until the webhook's caches hold both the Node and the new GPUNode it denies.
            try:
                return core.create_namespaced_pod(namespace, body)
            except ApiException as error:
                if error.status in (400, 403, 500):
                    denials.append(error.body or "")
                    return None
                raise

        pod = wait_for(
            admitted,
            "admission onto the agent's node",
            timeout=30.0,
            denials=denials,
            explain=lambda: "webhook log:\n" + webhook.log_tail(40),
        )
        assignment = codec.decode_assignment(pod.metadata.annotations[names.ANNOTATION_ASSIGNMENT])
        assert assignment.node == node
        (alloc,) = assignment.allocations()
        assert alloc.uuid in uuids

        # Kubelet's part: allocate what the (mutated) container asks for, then start it.
        limits = pod.spec.containers[0].resources.limits
        ref = ContainerRef(namespace, "trainer", "main")
        keys = []
        for resource in (names.RESOURCE_VCUDA_CORE, names.RESOURCE_VCUDA_MEMORY):
            ids, reply = kubelet.allocate(ref, resource, int(limits[resource]))
            assert not any(m.container_path == "" for m in reply.mounts)
            keys.append(allocation_key(resource, ids))
        for resource in (names.RESOURCE_VCUDA_CORE, names.RESOURCE_VCUDA_MEMORY):
            kubelet.pre_start(ref, resource)

        files = AllocationFiles(agent.state_dir)
        texts = {files.limits_path(k).read_text() for k in keys}
        assert len(texts) == 1  # both mounts candidates carry the same limits
        written = decode_limits(texts.pop().encode())
        assert (written.namespace, written.pod, written.container) == (namespace, "trainer", "main")
        assert alloc.memory_mib == 32768
        assert (assignment.memory_scaling, assignment.compute_limit) == (2.0, False)
        assert written.devices == (
            DeviceLimits(
                alloc.uuid, alloc.memory_mib * 1024 * 1024, alloc.cores, core_limit_max=60
            ),
        )
        assert not written.compute_limit_enabled and not written.whole
        assert written.memory_host_fallback  # 32 GiB on a 24 GiB GPU: the rest from the host
        assert written.context_overhead_bytes == 256 << 20
        series = f'fracgpu_context_overhead_bytes{{node="{node}",source="measured"}}'
        assert agent.scrape()[series] == 256 << 20
        assert (agent.node_dir.stat().st_mode & 0o7777) == 0o755  # the boards: the agent's only

        # A GPU that stops answering NVML is published unhealthy, and healthy once it answers.
        def healthy_flags() -> list[bool]:
            return [d["healthy"] for d in _published_devices(custom, node)]

        double.set("device.1.nvml_error.nvmlDeviceGetMemoryInfo", 15)
        wait_for(lambda: healthy_flags() == [True, False], "GPU 1 published unhealthy", 30.0)
        double.set("device.1.nvml_error.nvmlDeviceGetMemoryInfo", None)
        wait_for(lambda: healthy_flags() == [True, True], "GPU 1 published healthy again", 30.0)
    finally:
        assert agent.stop() == 0
        kubelet.close()
        for delete in (
            lambda: core.delete_namespaced_pod("trainer", namespace),
            lambda: custom.delete_cluster_custom_object(
                names.GROUP, names.CRD_VERSION, names.GPUNODE_PLURAL, node
            ),
            lambda: core.delete_node(node),
        ):
            try:
                delete()
            except ApiException as error:
                if error.status != 404:
                    raise
