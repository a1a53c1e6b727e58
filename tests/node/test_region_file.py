"""Where a GPU container's accounting region lives, on the real path (the webhook's
mutation, kubelet's volume manager, containerd, runc, the agent): in the container's region
volume, its own pod's memory, so nothing the container writes there reaches the host's
disk, and the agent still reads the region for its metrics."""

from __future__ import annotations

import os
from pathlib import Path

from fracgpu import codec, names
from fracgpu.shim_abi import BOARD_SIZE

from .pods import MIB, delete, pod_body, wait_running
from .tier.tier import NodeTier, wait_for

HELD = 3 * MIB
WRITTEN = 8 * MIB  # under the volume's sizeLimit (16Mi), which 1.22+ makes the tmpfs size


def _mount_type(path: Path) -> str | None:
    """The file system type of the mount at exactly ``path`` on the host, if one is there."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(path):
            return fields[fields.index("-") + 1]
    return None


def test_a_container_keeps_its_region_in_its_pods_memory_and_the_agent_reads_it(
    node_tier: NodeTier, namespace: str
) -> None:
    limits = {names.RESOURCE_VCUDA_CORE: "20", names.RESOURCE_VCUDA_MEMORY: "4"}
    command = f"/probes/mem_ops ctx 0 alloc {HELD} sleep 600000"
    node_tier.core.create_namespaced_pod(
        namespace, pod_body("grower", limits=limits, command=command)
    )
    pod = wait_running(node_tier, namespace, "grower")
    (status,) = pod.status.container_statuses
    volume = names.region_volume_name("main")

    # The agent finds the region in the pod's region volume and exports what it holds.
    def held() -> float | None:
        for sample, value in node_tier.agent_metrics().items():
            if sample.startswith("fracgpu_container_memory_used_bytes{") and (
                'pod="grower"' in sample and f'namespace="{namespace}"' in sample
            ):
                return value if value == HELD else None
        return None

    assert wait_for(held, "the container's region in the agent's metrics", 30) == HELD

    # In the container, the region's directory is a tmpfs: the pod's memory.
    mounts = node_tier.exec_in(status.container_id, "cat", "/proc/mounts")
    (line,) = [m for m in mounts.splitlines() if m.split()[1] == names.CONTAINER_REGION_DIR]
    assert line.split()[2] == "tmpfs", line
    # The attack: fill the host's disk through the one directory the container can write
    # that is not its own layer. It lands in its pod's memory.
    node_tier.exec_in(
        status.container_id,
        "dd",
        "if=/dev/zero",
        f"of={names.CONTAINER_REGION_DIR}/junk",
        f"bs={MIB}",
        f"count={WRITTEN // MIB}",
    )
    seen = node_tier.exec_in(status.container_id, "ls", "-A", names.CONTAINER_REGION_DIR)
    assert sorted(seen.split()) == ["junk", "region"], seen

    # The priority board of its GPU, one file mounted by runc, as the agent publishes it.
    # (This node has one GPU; that no other GPU's board is given is
    # tests/agent/test_device_plugin.py's.)
    assignment = codec.decode_assignment(pod.metadata.annotations[names.ANNOTATION_ASSIGNMENT])
    (gpu,) = {d.uuid for c in assignment.containers for d in c.devices}
    boards = node_tier.exec_in(status.container_id, "ls", "-A", names.CONTAINER_NODE_DIR)
    assert boards.split() == [gpu], boards
    board = f"{names.CONTAINER_NODE_DIR}/{gpu}"
    size = node_tier.exec_in(status.container_id, "wc", "-c", board)
    assert size.split()[0] == str(BOARD_SIZE), size
    mounted = {m.split()[1]: m.split()[3] for m in mounts.splitlines()}
    assert names.CONTAINER_NODE_DIR not in mounted  # the file, not the node's directory
    assert mounted[board].split(",")[0] == "ro", mounted[board]

    # On the host: the volume is kubelet's tmpfs for this pod, and the agent's directories
    # hold nothing of the container's.
    assert node_tier.kubelet is not None and node_tier.agent is not None
    host_volume = (
        node_tier.kubelet.root_dir
        / "pods"
        / pod.metadata.uid
        / names.KUBELET_EMPTY_DIR_VOLUMES
        / volume
    )
    assert _mount_type(host_volume) == "tmpfs"
    assert os.stat(host_volume / "junk").st_size == WRITTEN
    # Only the agent's own files (limits; queue mode's served records): no run directory.
    assert {p.name for p in node_tier.agent.state_dir.glob("*/*")} <= {"limits", "served"}

    # Deleted, the pod is gone within seconds: nothing of the agent's keeps kubelet from
    # unmounting the volume (a region the agent held open did, for over a minute).
    delete(node_tier, namespace, "grower", timeout=20)
    assert _mount_type(host_volume) is None
