"""Compute slice: the container's GPU time tracks its core limit.

Kernels run on the test double's device timeline (CLOCK_MONOTONIC), taking the
time encoded in their name; launch_ops reports the share of wall time its
kernels kept the device busy.
"""

from __future__ import annotations

import subprocess

import pytest

from fracgpu import shim_abi
from tests.shim.sandbox import UUIDS, GiB, Sandbox, step

KERNEL_US = "2000"
TOLERANCE = 0.05


def busy(out: str) -> float:
    return float(step(out, "launch")[3])


def run_launches(node: Sandbox, kind: str = "launch", seconds: str = "2", **kw: object) -> float:
    out = node.run("launch_ops", KERNEL_US, seconds, kind, timeout=60, **kw)  # type: ignore[arg-type]
    assert out.returncode == 0, out.stdout + out.stderr
    return busy(out.stdout)


def test_thirty_percent_slice_runs_at_thirty_percent(node: Sandbox) -> None:
    node.write_limits(core=30)
    share = run_launches(node)
    assert abs(share - 0.30) <= TOLERANCE, share
    device = node.region().devices[0]
    assert device.kernel_launches > 100
    assert device.throttle_ns > 0
    # every launch is measured except those still in flight at exit (at most 16)
    kernel_ns = 2_000_000
    assert (device.kernel_launches - 16) * kernel_ns <= device.kernel_time_ns
    assert device.kernel_time_ns <= device.kernel_launches * kernel_ns * 1.01


def test_full_core_limit_is_not_paced(node: Sandbox) -> None:
    node.write_limits(core=100)
    assert run_launches(node, seconds="1") >= 0.95


def test_compute_limit_can_be_disabled(node: Sandbox) -> None:
    node.write_limits(core=30, compute_limit_enabled=False)
    assert run_launches(node, seconds="1") >= 0.95


@pytest.mark.parametrize(
    ("kind", "lookup"),
    [("ex", "direct"), ("coop", "dlsym"), ("graph", "procaddr"), ("launch", "procaddr_ptds")],
)
def test_every_launch_path_is_paced(node: Sandbox, kind: str, lookup: str) -> None:
    node.write_limits(core=50)
    share = run_launches(node, kind=kind, seconds="1.5", lookup=lookup)
    assert abs(share - 0.50) <= TOLERANCE, share


def start_launches(node: Sandbox, seconds: str, **kw: object) -> subprocess.Popen[str]:
    return node.start("launch_ops", KERNEL_US, seconds, "launch", **kw)


def test_processes_of_one_container_share_its_slice(node: Sandbox) -> None:
    node.write_limits(core=40)
    procs = [start_launches(node, "2.5") for _ in range(2)]
    shares = [busy(p.communicate(timeout=60)[0]) for p in procs]
    assert abs(sum(shares) - 0.40) <= TOLERANCE, shares


def test_two_containers_split_the_gpu_by_their_slices(node: Sandbox) -> None:
    other = node.root / "other"
    other.mkdir()
    (other / "limits").write_bytes(
        shim_abi.encode_limits(shim_abi.Limits(devices=(shim_abi.DeviceLimits(UUIDS[0], GiB, 75),)))
    )
    node.write_limits(core=25)
    small = start_launches(node, "3")
    big = start_launches(
        node,
        "3",
        region=other / "region",
        extra={"FRACGPU_TEST_LIMITS_PATH": str(other / "limits")},
    )
    small_share = busy(small.communicate(timeout=60)[0])
    big_share = busy(big.communicate(timeout=60)[0])
    assert abs(small_share - 0.25) <= TOLERANCE, (small_share, big_share)
    assert abs(big_share - 0.75) <= TOLERANCE, (small_share, big_share)


def test_burst_when_alone_only_if_configured_and_alone(node: Sandbox) -> None:
    node.publish_boards()
    node.write_limits(core=30, burst_when_alone=True)
    assert run_launches(node, seconds="1") >= 0.9


def test_burst_needs_the_board_to_know_it_is_alone(node: Sandbox) -> None:
    node.write_limits(core=30, burst_when_alone=True)  # no node directory
    share = run_launches(node, seconds="1.5")
    assert abs(share - 0.30) <= TOLERANCE, share


def test_a_bursting_container_returns_to_its_slice_next_to_another(node: Sandbox) -> None:
    node.publish_boards()
    other = node.root / "other"
    other.mkdir()
    (other / "limits").write_bytes(
        shim_abi.encode_limits(shim_abi.Limits(devices=(shim_abi.DeviceLimits(UUIDS[0], GiB, 30),)))
    )
    node.write_limits(core=30, burst_when_alone=True)
    burster = start_launches(node, "3")
    neighbour = start_launches(
        node,
        "3",
        region=other / "region",
        extra={"FRACGPU_TEST_LIMITS_PATH": str(other / "limits")},
    )
    shares = [busy(p.communicate(timeout=60)[0]) for p in (burster, neighbour)]
    assert all(abs(s - 0.30) <= TOLERANCE for s in shares), shares


def test_elastic_bound_applies_only_when_alone(node: Sandbox) -> None:
    limits = shim_abi.Limits(devices=(shim_abi.DeviceLimits(UUIDS[0], GiB, 30, 60),))
    node.limits_path.write_bytes(shim_abi.encode_limits(limits))
    share = run_launches(node, seconds="1.5")  # no board: nobody can tell it is alone
    assert abs(share - 0.30) <= TOLERANCE, share
    node.publish_boards()
    share = run_launches(node, seconds="1.5")
    assert abs(share - 0.60) <= TOLERANCE, share


@pytest.mark.parametrize(
    ("kind", "lookup"),
    [
        ("ctx2", "direct"),  # one launch in the primary context, the rest in a second one
        ("ctxmix", "procaddr"),  # alternating between two contexts and their streams
        ("xctx", "dlsym"),  # one context current, launching on another context's stream
        ("ctxchurn", "direct"),  # create a context, launch, destroy it (its events die too)
        ("culaunch", "direct"),  # deprecated cuLaunch
        ("grid", "dlsym"),  # deprecated cuLaunchGrid
        ("gridasync", "procaddr"),  # deprecated cuLaunchGridAsync
        ("multi", "procaddr_ptds"),  # cuLaunchCooperativeKernelMultiDevice
    ],
)
def test_no_context_or_entry_point_escapes_the_slice(node: Sandbox, kind: str, lookup: str) -> None:
    node.write_limits(core=10)
    share = run_launches(node, kind=kind, seconds="1.5", lookup=lookup)
    assert abs(share - 0.10) <= TOLERANCE, share
    device = node.region().devices[0]
    assert device.throttle_ns > 0
