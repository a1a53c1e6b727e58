"""The GPUNode publisher against a real kube-apiserver + etcd."""

import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from agent.deviceplugin.state import DeviceState
from agent.discovery import NodeGPUs
from agent.inventory import InventoryLoop, InventoryPublisher
from agent.nodesettings import follow_memory_scaling
from fracgpu.names import CRD_VERSION, GPUNODE_PLURAL, GROUP
from tests.agent.conftest import GPU_A, GPU_B

pytestmark = pytest.mark.e2e

GPUS = NodeGPUs(devices=(GPU_A, GPU_B), driver_version="550.54.15", cuda_driver_version="12.4")


@pytest.fixture
def custom(kube_client: kubernetes.client.ApiClient, fracgpu_crds: list[str]) -> Any:
    return kubernetes.client.CustomObjectsApi(kube_client)


@pytest.fixture
def node_name(custom: Any) -> Iterator[str]:
    name = f"agent-{uuid.uuid4().hex[:8]}"
    yield name
    try:
        custom.delete_cluster_custom_object(GROUP, CRD_VERSION, GPUNODE_PLURAL, name)
    except ApiException as error:
        if error.status != 404:
            raise


def _get(custom: Any, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom.get_cluster_custom_object(GROUP, CRD_VERSION, GPUNODE_PLURAL, name)
    return obj


def test_creates_the_gpunode_with_devices(custom: Any, node_name: str) -> None:
    publisher = InventoryPublisher(custom, node_name)
    assert publisher.publish(GPUS, {GPU_A.uuid: True, GPU_B.uuid: True})
    status = _get(custom, node_name)["status"]
    assert [d["uuid"] for d in status["devices"]] == [GPU_A.uuid, GPU_B.uuid]
    assert status["devices"][1] == {
        "uuid": GPU_B.uuid,
        "index": 1,
        "model": "NVIDIA A10",
        "memoryMiB": 24576,
        "healthy": True,
        "migEnabled": False,
        "pciBusId": "00000000:02:00.0",
    }
    assert "pciBusId" not in status["devices"][0]  # unknown bus id: left out
    assert status["driverVersion"] == "550.54.15"
    assert status["cudaDriverVersion"] == "12.4"
    assert status["updatedAt"]


def test_writes_only_when_something_changed(custom: Any, node_name: str) -> None:
    publisher = InventoryPublisher(custom, node_name)
    health = {GPU_A.uuid: True, GPU_B.uuid: True}
    assert publisher.publish(GPUS, health)
    version = _get(custom, node_name)["metadata"]["resourceVersion"]
    assert not publisher.publish(GPUS, health)
    assert _get(custom, node_name)["metadata"]["resourceVersion"] == version
    assert publisher.publish(GPUS, {GPU_A.uuid: False, GPU_B.uuid: True})
    devices = _get(custom, node_name)["status"]["devices"]
    assert [d["healthy"] for d in devices] == [False, True]


def test_keeps_the_fields_the_webhook_owns(custom: Any, node_name: str) -> None:
    publisher = InventoryPublisher(custom, node_name)
    publisher.publish(GPUS, {})
    allocated = [{"uuid": GPU_A.uuid, "cores": 30, "memoryMiB": 4096, "containers": 1}]
    custom.patch_cluster_custom_object_status(
        GROUP,
        CRD_VERSION,
        GPUNODE_PLURAL,
        node_name,
        {"status": {"allocated": allocated, "summary": {"gpus": 2}}},
    )
    assert publisher.publish(GPUS, {GPU_B.uuid: False})
    status = _get(custom, node_name)["status"]
    assert status["allocated"] == allocated
    assert status["summary"] == {"gpus": 2}
    assert status["devices"][1]["healthy"] is False


def test_recreates_a_deleted_gpunode(custom: Any, node_name: str) -> None:
    publisher = InventoryPublisher(custom, node_name)
    publisher.publish(GPUS, {})
    custom.delete_cluster_custom_object(GROUP, CRD_VERSION, GPUNODE_PLURAL, node_name)
    assert publisher.publish(GPUS, {})
    assert len(_get(custom, node_name)["status"]["devices"]) == 2


def test_loop_publishes_health_changes_and_recreates_after_deletion(
    custom: Any, node_name: str
) -> None:
    health = {GPU_A.uuid: True, GPU_B.uuid: True}
    loop = InventoryLoop(
        InventoryPublisher(custom, node_name), GPUS, lambda: dict(health), resync_seconds=0.3
    )
    loop.start()
    try:
        _until(lambda: _devices(custom, node_name), "the first publish")
        health[GPU_A.uuid] = False
        loop.health_changed(dict(health))
        _until(
            lambda: [d["healthy"] for d in _devices(custom, node_name)] == [False, True],
            "the health change",
        )
        custom.delete_cluster_custom_object(GROUP, CRD_VERSION, GPUNODE_PLURAL, node_name)
        _until(lambda: len(_devices(custom, node_name)) == 2, "the GPUNode to come back")
    finally:
        loop.stop()


def _devices(custom: Any, name: str) -> list[dict[str, Any]]:
    try:
        return list((_get(custom, name).get("status") or {}).get("devices") or [])
    except ApiException:
        return []


def _until(predicate: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_node_memory_scaling_follows_the_gpunode_spec(custom: Any, node_name: str) -> None:
    state = DeviceState(GPUS.devices, memory_scaling=1.5)
    publisher = InventoryPublisher(
        custom, node_name, on_spec=follow_memory_scaling(state.set_memory_scaling, 1.5)
    )
    publisher.publish(GPUS, {})
    assert state.snapshot()[3] == 1.5  # no spec value: the agent's own setting
    custom.patch_cluster_custom_object(
        GROUP, CRD_VERSION, GPUNODE_PLURAL, node_name, {"spec": {"memoryScaling": 3}}
    )
    publisher.publish(GPUS, {})
    assert state.snapshot()[3] == 3.0
    with pytest.raises(ApiException) as refused:  # the CRD schema bounds it
        custom.patch_cluster_custom_object(
            GROUP, CRD_VERSION, GPUNODE_PLURAL, node_name, {"spec": {"memoryScaling": 40}}
        )
    assert refused.value.status == 422
