"""GPU pods in each dialect go through the real path (webhook, kube-scheduler, kubelet's
device manager calling the agent's plugins, containerd, runc, the container toolkit's driver
mount) and their CUDA and NVML programs see exactly their slice and get CUDA's
out-of-memory error past it."""

from __future__ import annotations

import pytest

from fracgpu import codec, names
from fracgpu.shim_abi import decode_limits

from .pods import (
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    GIB,
    MIB,
    cuda_steps,
    pod_body,
    probe_script,
    read,
    run_probe,
    sections,
)
from .tier.tier import GPU_UUID, NODE_NAME, NodeTier

# (dialect, pod limits, expected slice bytes, expected core percent)
DIALECTS = [
    pytest.param(
        {names.RESOURCE_VCUDA_CORE: "30", names.RESOURCE_VCUDA_MEMORY: "8"},  # 8 x 256 MiB
        2 * GIB,
        30,
        id="tkestack",
    ),
    pytest.param(
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3072", "nvidia.com/gpucores": "20"},
        3 * GIB,
        20,
        id="hami",
    ),
]


@pytest.mark.parametrize(("limits", "slice_bytes", "cores"), DIALECTS)
def test_dialect_pod_sees_its_slice_and_runs_out_of_memory_past_it(
    node_tier: NodeTier, namespace: str, limits: dict[str, str], slice_bytes: int, cores: int
) -> None:
    half = slice_bytes // 2
    # Past the slice at once; then the slice in two halves; then one MiB more.
    steps = f"alloc {slice_bytes + MIB} alloc {half} alloc {half} alloc {MIB} info"
    report = run_probe(
        node_tier, namespace, pod_body("probe", limits=limits, command=probe_script(steps))
    )
    seen = sections(report)
    pod = read(node_tier, namespace, "probe")
    assert pod.spec.node_name == NODE_NAME, "kube-scheduler bound the pod to the pinned node"
    assignment = codec.decode_assignment(pod.metadata.annotations[names.ANNOTATION_ASSIGNMENT])
    assert [a.uuid for a in assignment.allocations()] == [GPU_UUID]

    # The webhook's variable reached the container; the toolkit mounted the driver for it.
    assert seen["env"] == [f"NVIDIA_VISIBLE_DEVICES={GPU_UUID}"], report
    assert seen["driver"] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"], report
    assert seen["preload"] == ["/usr/local/fracgpu/lib/libfracgpu.so"], report

    # The limits file the agent wrote at PreStartContainer, read inside the container.
    limits_file = decode_limits(("\n".join(seen["limits"]) + "\n").encode())
    assert (limits_file.namespace, limits_file.pod, limits_file.container) == (
        namespace,
        "probe",
        "main",
    )
    assert limits_file.pod_uid == pod.metadata.uid
    ((device),) = limits_file.devices
    assert (device.uuid, device.memory_limit_bytes, device.core_limit) == (
        GPU_UUID,
        slice_bytes,
        cores,
    )

    # cuMemGetInfo shows the slice, not the 16 GiB GPU; allocations past it fail with
    # CUDA's out-of-memory error, up to it succeed.
    steps_seen = cuda_steps(seen["cuda"])
    assert steps_seen[0] == ["ctx", str(CUDA_SUCCESS)], report
    assert steps_seen[1] == ["info", "0", str(slice_bytes), str(slice_bytes)], report
    assert [s[:2] for s in steps_seen[2:6]] == [
        ["alloc", str(CUDA_ERROR_OUT_OF_MEMORY)],
        ["alloc", str(CUDA_SUCCESS)],
        ["alloc", str(CUDA_SUCCESS)],
        ["alloc", str(CUDA_ERROR_OUT_OF_MEMORY)],
    ], report
    assert steps_seen[6] == ["info", "0", "0", str(slice_bytes)], report

    # NVML (what nvidia-smi reads) shows the slice as the GPU's total memory.
    nvml = [line.split() for line in seen["nvml"] if line.startswith("mem ")]
    assert [(m[2], m[3], m[4]) for m in nvml] == [(GPU_UUID, "0", str(slice_bytes))], report

    # The workload cannot raise its own limits.
    assert seen["tamper"] == ["limits read-only"], report
