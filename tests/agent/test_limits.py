"""From a pod's assignment to its container's limits: checks against this node."""

import dataclasses
import subprocess
from pathlib import Path

import pytest

from agent.limits import LimitsError, limits_for, render_limits
from agent.podlookup import PodInfo
from fracgpu.codec import encode_assignment
from fracgpu.model import Assignment, ContainerAssignment, GPUAllocation, Priority
from fracgpu.shim_abi import DeviceLimits, decode_limits
from tests.agent.conftest import GPU_A, GPU_B, NODE, assigned_pod
from tests.agent.nvml_double import SHIM_BUILD, ensure_shim_built

LIMITS_CHECK = SHIM_BUILD / "tests" / "limits_check"

GPUS = {GPU_A.uuid: GPU_A, GPU_B.uuid: GPU_B}
MIB = 1 << 20


def test_sliced_limits_per_gpu() -> None:
    pod = assigned_pod(
        "p",
        {"main": [GPUAllocation(GPU_A.uuid, 40, 8192), GPUAllocation(GPU_B.uuid, 40, 8192)]},
    )
    limits = limits_for(pod, "main", NODE, GPUS)
    assert not limits.whole and limits.compute_limit_enabled
    summary = decode_limits(render_limits(limits).encode())
    assert summary.devices == (
        DeviceLimits(GPU_A.uuid, 8192 * MIB, 40),
        DeviceLimits(GPU_B.uuid, 8192 * MIB, 40),
    )
    assert (summary.namespace, summary.pod, summary.container) == ("team-a", "p", "main")


def test_whole_gpu_with_all_its_memory_is_whole_mode() -> None:
    pod = assigned_pod("p", {"main": [GPUAllocation(GPU_A.uuid, 100, GPU_A.memory_mib)]})
    limits = limits_for(pod, "main", NODE, GPUS)
    assert limits.whole
    assert "mode=whole" in render_limits(limits)


def test_best_effort_compute_turns_compute_limiting_off() -> None:
    pod = assigned_pod("p", {"main": [GPUAllocation(GPU_A.uuid, 0, 1024)]})
    limits = limits_for(pod, "main", NODE, GPUS)
    assert not limits.compute_limit_enabled and not limits.whole
    assert "compute_limit_enabled=0" in render_limits(limits)


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


@pytest.mark.parametrize(
    ("allocations", "mode", "compute", "devices"),
    [
        (
            [GPUAllocation(GPU_A.uuid, 30, 4096)],
            "sliced",
            "1",
            [f"device 0 {GPU_A.uuid} {4096 * MIB} 30 30"],
        ),
        (
            [GPUAllocation(GPU_A.uuid, 0, 1024)],
            "sliced",
            "0",
            [f"device 0 {GPU_A.uuid} {1024 * MIB} 100 100"],
        ),
        (
            [
                GPUAllocation(GPU_A.uuid, 100, GPU_A.memory_mib),
                GPUAllocation(GPU_B.uuid, 100, GPU_B.memory_mib),
            ],
            "whole",
            "0",
            [
                f"device 0 {GPU_A.uuid} {GPU_A.memory_mib * MIB} 100 100",
                f"device 1 {GPU_B.uuid} {GPU_B.memory_mib * MIB} 100 100",
            ],
        ),
    ],
)
def test_the_shim_reads_what_the_agent_writes(
    tmp_path: Path, allocations: list[GPUAllocation], mode: str, compute: str, devices: list[str]
) -> None:
    ensure_shim_built()
    pod = assigned_pod("p", {"main": allocations})
    path = tmp_path / "limits"
    path.write_text(render_limits(limits_for(pod, "main", NODE, GPUS)))
    result = subprocess.run(
        [str(LIMITS_CHECK), str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    read = dict(line.split(" ", 1) for line in lines if not line.startswith("device "))
    assert read["mode"] == mode
    assert read["compute_limit_enabled"] == compute
    assert (read["namespace"], read["pod"], read["container"]) == ("team-a", "p", "main")
    assert read["pod_uid"] == "uid-p"
    assert read["device_count"] == str(len(devices))
    assert [line for line in lines if line.startswith("device ")] == devices


@pytest.mark.parametrize(
    ("annotations", "priority"),
    [
        ({}, 1),
        ({"fracgpu.io/priority": "high"}, 0),
        ({"nvidia.com/priority": "0"}, 0),
        ({"nvidia.com/priority": "1"}, 1),
        ({"fracgpu.io/priority": "low", "nvidia.com/priority": "0"}, 1),  # fracgpu's wins
    ],
)
def test_priority_comes_from_the_pod_annotations(
    annotations: dict[str, str], priority: int
) -> None:
    pod = assigned_pod("p", {"main": [GPUAllocation(GPU_A.uuid, 10, 512)]})
    limits = limits_for(dataclasses.replace(pod, priority=annotations), "main", NODE, GPUS)
    assert limits.priority == priority
    assert f"priority={priority}" in render_limits(limits)


def test_an_unreadable_priority_is_refused() -> None:
    pod = assigned_pod("p", {"main": [GPUAllocation(GPU_A.uuid, 10, 512)]})
    pod = dataclasses.replace(pod, priority={"nvidia.com/priority": "urgent"})
    with pytest.raises(
        LimitsError, match=r"nvidia\.com/priority='urgent' is not allowed: use 0 or 1"
    ):
        limits_for(pod, "main", NODE, GPUS)


def _pod_with(
    devices: list[GPUAllocation],
    *,
    core_limit: int | None = None,
    memory_scaling: float = 1.0,
    compute_limit: bool = True,
    priority: Priority | None = None,
    annotations: dict[str, str] | None = None,
) -> PodInfo:
    assignment = Assignment(
        NODE,
        "r-p",
        (ContainerAssignment("main", tuple(devices), core_limit, priority),),
        memory_scaling=memory_scaling,
        compute_limit=compute_limit,
    )
    return PodInfo("team-a", "p", "uid-p", NODE, encode_assignment(assignment), annotations or {})


def _shim_reads(tmp_path: Path, pod: PodInfo) -> dict[str, str]:
    ensure_shim_built()
    path = tmp_path / "limits"
    path.write_text(render_limits(limits_for(pod, "main", NODE, GPUS)))
    result = subprocess.run(
        [str(LIMITS_CHECK), str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


def test_vcuda_core_limit_becomes_the_elastic_bound_the_shim_reads(tmp_path: Path) -> None:
    pod = _pod_with([GPUAllocation(GPU_A.uuid, 30, 4096)], core_limit=70)
    limits = limits_for(pod, "main", NODE, GPUS)
    assert limits.devices[0].core_limit == 30
    assert limits.devices[0].core_limit_max == 70
    read = _shim_reads(tmp_path, pod)
    assert read["device"] == f"0 {GPU_A.uuid} {4096 * MIB} 30 70"
    assert read["compute_limit_enabled"] == "1"


def test_no_core_limit_means_no_elastic_bound() -> None:
    pod = _pod_with([GPUAllocation(GPU_A.uuid, 30, 4096)])
    assert limits_for(pod, "main", NODE, GPUS).devices[0].core_limit_max is None
    assert "core_limit_max" not in render_limits(limits_for(pod, "main", NODE, GPUS))


def test_a_node_without_compute_limits_writes_compute_limiting_off(tmp_path: Path) -> None:
    pod = _pod_with([GPUAllocation(GPU_A.uuid, 30, 4096)], compute_limit=False)
    limits = limits_for(pod, "main", NODE, GPUS)
    assert not limits.compute_limit_enabled and not limits.whole
    assert limits.devices[0].memory_limit_bytes == 4096 * MIB  # memory stays limited
    assert _shim_reads(tmp_path, pod)["compute_limit_enabled"] == "0"


def test_all_of_a_gpus_cores_with_part_of_its_memory_is_not_paced() -> None:
    pod = _pod_with([GPUAllocation(GPU_A.uuid, 100, 4096)])
    limits = limits_for(pod, "main", NODE, GPUS)
    assert not limits.whole  # memory is still sliced
    assert not limits.compute_limit_enabled  # but pacing at 100 % would only cost


@pytest.mark.parametrize(
    ("asked_mib", "scaling", "limit_mib", "whole"),
    [
        (GPU_A.memory_mib, 1.0, GPU_A.memory_mib, True),
        (GPU_A.memory_mib * 2, 1.0, GPU_A.memory_mib, True),  # never past physical without it
        (GPU_A.memory_mib * 2, 2.0, GPU_A.memory_mib * 2, False),
        (GPU_A.memory_mib * 3, 2.0, GPU_A.memory_mib * 2, False),  # never past physical x factor
    ],
)
def test_memory_scaling_lets_a_slice_pass_the_physical_memory(
    asked_mib: int, scaling: float, limit_mib: int, whole: bool
) -> None:
    pod = _pod_with([GPUAllocation(GPU_A.uuid, 100, asked_mib)], memory_scaling=scaling)
    limits = limits_for(pod, "main", NODE, GPUS)
    assert limits.whole is whole
    assert limits.devices[0].memory_limit_bytes == limit_mib * MIB
    assert limits.memory_host_fallback is (scaling > 1)


def test_the_shim_reads_host_fallback_on_a_scaled_node(tmp_path: Path) -> None:
    pod = _pod_with([GPUAllocation(GPU_A.uuid, 30, GPU_A.memory_mib * 2)], memory_scaling=2.0)
    assert _shim_reads(tmp_path, pod)["memory_host_fallback"] == "1"
    plain = _pod_with([GPUAllocation(GPU_A.uuid, 30, 4096)])
    assert _shim_reads(tmp_path, plain)["memory_host_fallback"] == "0"


@pytest.mark.parametrize(
    ("own", "annotations", "level"),
    [
        (Priority.HIGH, {"fracgpu.io/priority": "low"}, 0),  # the container's own wins
        (Priority.LOW, {"nvidia.com/priority": "0"}, 1),
        (None, {"nvidia.com/priority": "0"}, 0),  # else the pod's annotations
        (None, {}, 1),
    ],
)
def test_a_containers_own_priority_wins_over_the_pods(
    own: Priority | None, annotations: dict[str, str], level: int
) -> None:
    pod = _pod_with([GPUAllocation(GPU_A.uuid, 30, 4096)], priority=own, annotations=annotations)
    assert limits_for(pod, "main", NODE, GPUS).priority == level


def test_context_overhead_reaches_the_limits_file() -> None:
    pod = assigned_pod("p", {"main": [GPUAllocation(GPU_A.uuid, 40, 8192)]})
    assert limits_for(pod, "main", NODE, GPUS).context_overhead_bytes == 0
    limits = limits_for(pod, "main", NODE, GPUS, context_overhead_bytes=300 * MIB)
    assert decode_limits(render_limits(limits).encode()).context_overhead_bytes == 300 * MIB
