"""Housekeeping across restarts: a container's files go only once kubelet has stopped
listing it for the whole grace period, as the agent saw it. Real device plugins, the
test kubelet over gRPC and its pod-resources API; a kubelet that has just restarted is
one whose pod-resources answer lacks containers that still run."""

import time
from pathlib import Path

import pytest

from agent.containers import live_keys
from agent.hostfiles import allocation_key
from agent.housekeeping import Housekeeper
from agent.podresources import PodResourcesClient
from agent.settings import SettingsError, parse_settings
from fracgpu.model import GPUAllocation
from fracgpu.names import RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY
from tests.agent.conftest import GPU_A, AgentRig, assigned_pod
from tests.agent.kubelet import ContainerRef

RESOURCES = (RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY)
GRACE = 0.5


def _start(rig: AgentRig, pod: str) -> tuple[ContainerRef, str, list[str]]:
    """A started container: its ref, its compute allocation's key, and both its keys."""
    rig.pods.add(assigned_pod(pod, {"main": [GPUAllocation(GPU_A.uuid, 30, 4096)]}))
    ref = ContainerRef("team-a", pod, "main")
    ids, _ = rig.kubelet.allocate(ref, RESOURCE_VCUDA_CORE, 30)
    memory_ids, _ = rig.kubelet.allocate(ref, RESOURCE_VCUDA_MEMORY, 16)
    rig.kubelet.pre_start(ref, RESOURCE_VCUDA_CORE)
    key = allocation_key(RESOURCE_VCUDA_CORE, ids)
    return ref, key, sorted([key, allocation_key(RESOURCE_VCUDA_MEMORY, memory_ids)])


def test_a_container_missing_from_one_kubelet_answer_keeps_its_files(
    rig: AgentRig, short_dir: Path
) -> None:
    ref, key, keys = _start(rig, "train")
    limits = rig.files.limits_path(key)
    written = (limits.read_bytes(), limits.stat().st_ino)
    source = PodResourcesClient(short_dir / "pr.sock")
    keeper = Housekeeper(rig.files, GRACE)
    time.sleep(GRACE + 0.1)  # the directory is older than the grace period

    # Kubelet restarted and has not read its pods back yet: it lists nothing.
    with rig.kubelet.lock:
        held = dict(rig.kubelet.allocations)
        rig.kubelet.allocations.clear()
    assert live_keys(source, RESOURCES) == {}
    assert keeper.sweep(live_keys(source, RESOURCES)) == []
    time.sleep(GRACE / 2)
    assert keeper.sweep(live_keys(source, RESOURCES)) == []
    with rig.kubelet.lock:
        rig.kubelet.allocations.update(held)
    time.sleep(GRACE)
    assert keeper.sweep(live_keys(source, RESOURCES)) == []  # listed again: counted afresh
    assert (limits.read_bytes(), limits.stat().st_ino) == written

    # The container really ends: its files go once it has been unlisted for the grace.
    rig.kubelet.release(ref)
    assert keeper.sweep(live_keys(source, RESOURCES)) == []
    time.sleep(GRACE + 0.1)
    assert sorted(keeper.sweep(live_keys(source, RESOURCES))) == keys
    assert not rig.files.directory(key).exists()


def test_a_restarted_agent_counts_the_grace_period_afresh(rig: AgentRig, short_dir: Path) -> None:
    ref, key, keys = _start(rig, "done")
    rig.kubelet.release(ref)
    time.sleep(GRACE + 0.1)  # unlisted and old, but this agent has not seen it unlisted yet
    source = PodResourcesClient(short_dir / "pr.sock")
    restarted = Housekeeper(rig.files, GRACE)
    assert restarted.sweep(live_keys(source, RESOURCES)) == []
    assert rig.files.directory(key).is_dir()
    time.sleep(GRACE + 0.1)
    assert sorted(restarted.sweep(live_keys(source, RESOURCES))) == keys


def test_without_grace_an_unlisted_directory_goes_when_two_sweeps_agree(
    rig: AgentRig, short_dir: Path
) -> None:
    _, live_key, _ = _start(rig, "live")
    ended_ref, _, ended_keys = _start(rig, "ended")
    keeper = Housekeeper(rig.files, 0)
    source = PodResourcesClient(short_dir / "pr.sock")
    # Allocate has made a directory kubelet has not recorded yet: one sweep sees it unowned.
    fresh = allocation_key(RESOURCE_VCUDA_MEMORY, ["GPU-fresh-mem-0"])
    rig.files.prepare(fresh)
    assert keeper.sweep(live_keys(source, RESOURCES)) == []
    assert rig.files.directory(fresh).is_dir()
    rig.kubelet.release(ended_ref)
    assert keeper.sweep(live_keys(source, RESOURCES)) == [fresh]  # two sweeps: unowned
    assert sorted(keeper.sweep(live_keys(source, RESOURCES))) == ended_keys
    assert rig.files.limits_path(live_key).is_file()


def test_housekeeping_interval_is_a_setting() -> None:
    assert parse_settings([], env={"NODE_NAME": "n"}).housekeeping_seconds == 60
    assert (
        parse_settings(["--node-name=n", "--housekeeping-seconds=0.5"]).housekeeping_seconds == 0.5
    )
    with pytest.raises(SettingsError, match="--housekeeping-seconds must be greater than 0"):
        parse_settings(["--node-name=n", "--housekeeping-seconds=0"], env={})
