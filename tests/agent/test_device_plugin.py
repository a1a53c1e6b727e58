"""The device plugins against the test kubelet, over real gRPC on unix sockets."""

import dataclasses
import os
import stat
from pathlib import Path

import grpc
import pytest

from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2 as dp
from agent.hostfiles import allocation_key
from fracgpu.model import GPUAllocation
from fracgpu.names import (
    CONTAINER_LIBRARY_PATH,
    CONTAINER_LIMITS_PATH,
    CONTAINER_NODE_DIR,
    CONTAINER_PRELOAD_PATH,
    RESOURCE_VCUDA_CORE,
    RESOURCE_VCUDA_MEMORY,
    region_volume_name,
)
from tests.agent.conftest import GPU_A, GPU_B, AgentRig, assigned_pod
from tests.agent.kubelet import ContainerRef

CORE = RESOURCE_VCUDA_CORE
MEM = RESOURCE_VCUDA_MEMORY


def test_registers_both_resources_and_lists_units(rig: AgentRig) -> None:
    core = rig.kubelet.wait_for_plugin(CORE)
    mem = rig.kubelet.wait_for_plugin(MEM)
    names = sorted(r.resource_name for r in rig.kubelet.registrations)
    assert names == [CORE, MEM]
    assert all(r.version == "v1beta1" for r in rig.kubelet.registrations)
    assert core.options.pre_start_required and core.options.get_preferred_allocation_available
    assert len(core.devices) == 200  # 100 per GPU
    assert len(mem.devices) == 2 * 24576 // 256
    assert set(core.devices.values()) == {"Healthy"}
    assert sum(1 for d in core.devices if d.startswith(GPU_B.uuid)) == 100


def test_unhealthy_gpu_is_reported_and_recovers(rig: AgentRig) -> None:
    conn = rig.kubelet.wait_for_plugin(CORE)
    before = conn.updates
    rig.state.set_health({GPU_A.uuid: False})
    devices = rig.kubelet.wait_for_update(CORE, before)
    unhealthy = {d for d, h in devices.items() if h == "Unhealthy"}
    assert len(unhealthy) == 100 and all(d.startswith(GPU_A.uuid) for d in unhealthy)
    after = rig.kubelet.wait_for_plugin(CORE).updates
    rig.state.set_health({GPU_A.uuid: True})
    devices = rig.kubelet.wait_for_update(CORE, after)
    assert set(devices.values()) == {"Healthy"}


def test_a_new_memory_scaling_is_advertised_to_kubelet(rig: AgentRig) -> None:
    conn = rig.kubelet.wait_for_plugin(MEM)
    before = conn.updates
    rig.state.set_memory_scaling(2.0)
    devices = rig.kubelet.wait_for_update(MEM, before)
    assert len(devices) == 2 * 2 * 24576 // 256  # twice the physical memory, per GPU
    assert len(rig.kubelet.wait_for_plugin(CORE).devices) == 200  # compute unchanged


def test_allocate_mounts_the_shim_without_host_paths_in_the_pod(rig: AgentRig) -> None:
    ref = ContainerRef("team-a", "train", "main")
    ids, reply = rig.kubelet.allocate(ref, CORE, 30)
    mounts = {m.container_path: m for m in reply.mounts}
    (gpu,) = {i.rsplit("-core-", 1)[0] for i in ids}
    board = f"{CONTAINER_NODE_DIR}/{gpu}"
    # Everything read-only: nothing of the host the container could write (its region is in
    # its pod's own region volume, which the webhook adds).
    assert set(mounts) == {
        CONTAINER_LIBRARY_PATH,
        CONTAINER_PRELOAD_PATH,
        CONTAINER_LIMITS_PATH,
        board,
    }
    assert all(m.read_only for m in mounts.values())
    # The board of its GPU only, made before the container starts; the boards are the
    # agent's: read-only to every container, writable by no one else.
    assert Path(mounts[board].host_path) == rig.dirs["node"] / gpu
    assert (rig.dirs["node"] / gpu).is_file()
    assert rig.dirs["node"].stat().st_mode & 0o7777 == 0o755
    assert Path(mounts[CONTAINER_LIBRARY_PATH].host_path) == rig.shim.library
    assert (
        Path(mounts[CONTAINER_PRELOAD_PATH].host_path).read_text() == CONTAINER_LIBRARY_PATH + "\n"
    )
    key = allocation_key(CORE, ids)
    assert sorted(p.name for p in rig.files.directory(key).iterdir()) == []  # limits at start
    assert not reply.envs  # limits never travel in the environment


def test_a_container_gets_the_boards_of_its_gpus_and_no_other(rig: AgentRig) -> None:
    """Every GPU's board says when each of its containers last launched work: a container
    given the whole node directory could watch its neighbours on the node's other GPUs."""

    def boards(reply: dp.ContainerAllocateResponse) -> dict[str, Path]:
        prefix = CONTAINER_NODE_DIR + "/"
        return {
            m.container_path.removeprefix(prefix): Path(m.host_path)
            for m in reply.mounts
            if m.container_path.startswith(prefix) and m.read_only
        }

    ids, one = rig.kubelet.allocate(ContainerRef("team-a", "one", "main"), CORE, 60)
    (gpu,) = {i.rsplit("-core-", 1)[0] for i in ids}
    assert boards(one) == {gpu: rig.dirs["node"] / gpu}
    assert CONTAINER_NODE_DIR not in {m.container_path for m in one.mounts}
    _, both = rig.kubelet.allocate(ContainerRef("team-a", "both", "main"), CORE, 140)
    assert boards(both) == {g.uuid: rig.dirs["node"] / g.uuid for g in (GPU_A, GPU_B)}


def test_preferred_allocation_packs_one_gpu(rig: AgentRig) -> None:
    ids, _ = rig.kubelet.allocate(ContainerRef("team-a", "p", "c"), CORE, 30)
    assert len(ids) == 30
    assert len({i.rsplit("-core-", 1)[0] for i in ids}) == 1


def test_prestart_writes_the_assigned_limits(rig: AgentRig) -> None:
    pod = assigned_pod("train", {"main": [GPUAllocation(GPU_B.uuid, 30, 4096)]})
    rig.pods.add(pod)
    ref = ContainerRef("team-a", "train", "main")
    core_ids, _ = rig.kubelet.allocate(ref, CORE, 30)
    mem_ids, _ = rig.kubelet.allocate(ref, MEM, 16)
    rig.kubelet.pre_start(ref, CORE)
    rig.kubelet.pre_start(ref, MEM)
    for key in (allocation_key(CORE, core_ids), allocation_key(MEM, mem_ids)):
        path = rig.files.limits_path(key)
        text = path.read_text()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o444
        fields = dict(line.split("=", 1) for line in text.splitlines())
        assert fields["version"] == "1"
        assert fields["namespace"] == "team-a"
        assert fields["pod"] == "train"
        assert fields["container"] == "main"
        assert fields["pod_uid"] == "uid-train"
        assert fields["device_count"] == "1"
        assert fields["device.0.uuid"] == GPU_B.uuid
        assert fields["device.0.memory_limit_bytes"] == str(4096 * 1024 * 1024)
        assert fields["device.0.core_limit"] == "30"


def test_prestart_tells_two_containers_apart(rig: AgentRig) -> None:
    pod = assigned_pod(
        "duo",
        {
            "left": [GPUAllocation(GPU_A.uuid, 20, 1024)],
            "right": [GPUAllocation(GPU_A.uuid, 50, 2048)],
        },
    )
    rig.pods.add(pod)
    left, right = ContainerRef("team-a", "duo", "left"), ContainerRef("team-a", "duo", "right")
    left_ids, _ = rig.kubelet.allocate(left, CORE, 20)
    right_ids, _ = rig.kubelet.allocate(right, CORE, 50)
    rig.kubelet.allocate(left, MEM, 4)  # as kubelet would: 1024 and 2048 MiB
    rig.kubelet.allocate(right, MEM, 8)
    rig.kubelet.pre_start(right, CORE)
    rig.kubelet.pre_start(left, CORE)
    left_text = rig.files.limits_path(allocation_key(CORE, left_ids)).read_text()
    right_text = rig.files.limits_path(allocation_key(CORE, right_ids)).read_text()
    assert "container=left" in left_text and "device.0.core_limit=20" in left_text
    assert "container=right" in right_text and "device.0.core_limit=50" in right_text


def test_prestart_refuses_a_pod_without_assignment(rig: AgentRig) -> None:
    pod = assigned_pod("plain", {"main": [GPUAllocation(GPU_A.uuid, 10, 512)]})
    rig.pods.add(type(pod)(pod.namespace, pod.name, pod.uid, pod.node_name, None))
    ref = ContainerRef("team-a", "plain", "main")
    ids, _ = rig.kubelet.allocate(ref, CORE, 10)
    with pytest.raises(grpc.RpcError) as raised:
        rig.kubelet.pre_start(ref, CORE)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "fracgpu.io/assignment" in str(raised.value.details())
    assert not rig.files.limits_path(allocation_key(CORE, ids)).exists()


def test_prestart_refuses_a_container_without_its_region_volume_unless_an_older_agent_ran_it(
    rig: AgentRig,
) -> None:
    """A pod an older webhook admitted has no region volume: its shim would find no
    directory for its region and fail every CUDA call. Refused at start, saying why and what
    to do; a container an older agent started (its run dir kept) starts again."""
    pod = assigned_pod("old", {"main": [GPUAllocation(GPU_A.uuid, 10, 512)]})
    rig.pods.add(dataclasses.replace(pod, region_containers=frozenset()))
    ref = ContainerRef("team-a", "old", "main")
    ids, _ = rig.kubelet.allocate(ref, CORE, 10)
    rig.kubelet.allocate(ref, MEM, 2)
    with pytest.raises(grpc.RpcError) as raised:
        rig.kubelet.pre_start(ref, CORE)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        f"container main has no fracgpu region volume ({region_volume_name('main')}, an "
        "emptyDir of medium Memory at /var/run/fracgpu)" in str(raised.value.details())
    )
    assert "Delete the pod and create it again" in str(raised.value.details())
    assert not rig.files.limits_path(allocation_key(CORE, ids)).exists()
    rig.files.run_dir(allocation_key(CORE, ids)).mkdir()  # what an older agent's Allocate made
    rig.kubelet.pre_start(ref, CORE)
    assert rig.files.limits_path(allocation_key(CORE, ids)).exists()


def test_prestart_refuses_an_assignment_larger_than_what_kubelet_allocated(
    rig: AgentRig,
) -> None:
    # e.g. an assignment rewritten through pods/status after admission: 90 cores claimed
    rig.pods.add(assigned_pod("greedy", {"main": [GPUAllocation(GPU_A.uuid, 90, 4096)]}))
    ref = ContainerRef("team-a", "greedy", "main")
    rig.kubelet.allocate(ref, CORE, 30)
    rig.kubelet.allocate(ref, MEM, 16)
    with pytest.raises(grpc.RpcError) as refused:
        rig.kubelet.pre_start(ref, CORE)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "holds 90 cores and 16 memory blocks, but kubelet allocated it 30 and 16" in str(
        refused.value.details()
    )


def test_prestart_refuses_devices_no_container_holds(rig: AgentRig) -> None:
    conn = rig.kubelet.wait_for_plugin(CORE)
    with pytest.raises(grpc.RpcError) as raised:
        conn.stub.PreStartContainer(
            dp.PreStartContainerRequest(devices_ids=[f"{GPU_A.uuid}-core-7"]), timeout=10
        )
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot tell which container" in str(raised.value.details())


def test_allocate_rejects_unknown_ids(rig: AgentRig) -> None:
    conn = rig.kubelet.wait_for_plugin(CORE)
    with pytest.raises(grpc.RpcError) as raised:
        conn.stub.Allocate(
            dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=["GPU-nope-core-1"])]
            ),
            timeout=5,
        )
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_kubelet_restart_makes_plugins_register_again(rig: AgentRig) -> None:
    rig.kubelet.wait_for_plugin(CORE)
    rig.kubelet.wait_for_plugin(MEM)
    first = len(rig.kubelet.registrations)
    rig.kubelet.restart()
    conn = rig.kubelet.wait_for_plugin(CORE)
    rig.kubelet.wait_for_plugin(MEM)
    assert len(rig.kubelet.registrations) == first + 2
    assert len(conn.devices) == 200
    # the new plugin socket answers
    ids, _ = rig.kubelet.allocate(ContainerRef("team-a", "after", "c"), CORE, 5)
    assert len(ids) == 5


def test_stop_removes_the_plugin_sockets(rig: AgentRig) -> None:
    rig.kubelet.wait_for_plugin(CORE)
    sockets = [s.socket for s in rig.manager.servers]
    assert all(s.exists() for s in sockets)
    rig.manager.stop()
    assert not any(s.exists() for s in sockets)
