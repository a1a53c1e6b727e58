"""From a pod's assignment to its container's limits: checks against this node."""

import dataclasses

import pytest

from agent.limits import LimitsError, limits_for, render_limits
from agent.podlookup import PodInfo
from agent.shim_abi_adapter import decode_limits
from fracgpu.model import GPUAllocation
from tests.agent.conftest import GPU_A, GPU_B, NODE, assigned_pod

GPUS = {GPU_A.uuid: GPU_A, GPU_B.uuid: GPU_B}
MIB = 1 << 20


def test_sliced_limits_per_gpu() -> None:
    pod = assigned_pod(
        "p",
        {"main": [GPUAllocation(GPU_A.uuid, 40, 8192), GPUAllocation(GPU_B.uuid, 40, 8192)]},
    )
    limits = limits_for(pod, "main", NODE, GPUS)
    assert not limits.whole and limits.compute_limit_enabled
    summary = decode_limits(render_limits(limits))
    assert summary.devices == ((GPU_A.uuid, 8192 * MIB, 40), (GPU_B.uuid, 8192 * MIB, 40))
    assert (summary.namespace, summary.pod, summary.container) == ("team-a", "p", "main")


def test_whole_gpu_with_all_its_memory_is_whole_mode() -> None:
    pod = assigned_pod("p", {"main": [GPUAllocation(GPU_A.uuid, 100, GPU_A.memory_mib)]})
    limits = limits_for(pod, "main", NODE, GPUS)
    assert limits.whole
    assert "mode=whole" in render_limits(limits)


def test_best_effort_compute_turns_compute_limiting_off() -> None:
    pod = assigned_pod("p", {"main": [GPUAllocation(GPU_A.uuid, 0, 1024)]})
    limits = limits_for(pod, "main", NODE, GPUS)
    assert not limits.compute_limit_enabled
    text = render_limits(limits)
    assert "compute_limit_enabled=0" in text and "core_limit" not in text.replace(
        "compute_limit_enabled", ""
    )


@pytest.mark.parametrize(
    ("change", "container", "message"),
    [
        (lambda p: dataclasses.replace(p, assignment=None), "main", "no fracgpu.io/assignment"),
        (lambda p: dataclasses.replace(p, assignment="{"), "main", "is not JSON"),
        (lambda p: p, "sidecar", "has no entry for it"),
    ],
)
def test_refusals_say_why(change: object, container: str, message: str) -> None:
    pod = assigned_pod("p", {"main": [GPUAllocation(GPU_A.uuid, 10, 512)]})
    changed: PodInfo = change(pod)  # type: ignore[operator]
    with pytest.raises(LimitsError, match=message):
        limits_for(changed, container, NODE, GPUS)


def test_assignment_for_another_node_or_gpu_is_refused() -> None:
    pod = assigned_pod("p", {"main": [GPUAllocation(GPU_A.uuid, 10, 512)]})
    with pytest.raises(LimitsError, match="assigned to node gpu-node-1, but this is node other"):
        limits_for(pod, "main", "other", GPUS)
    with pytest.raises(LimitsError, match="which this node does not have"):
        limits_for(pod, "main", NODE, {GPU_B.uuid: GPU_B})
