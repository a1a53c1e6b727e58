"""Discovery, health and GPU metrics through the real pynvml and the NVML test double."""

import threading
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from agent.containers import LiveContainer
from agent.discovery import discover
from agent.health import HealthMonitor
from agent.metrics import AgentCollector, build_registry
from agent.nvml_backend import NvmlError, PynvmlBackend
from fracgpu.shim_abi import DeviceLimits, Limits
from tests.agent.nvml_double import (
    NvmlDouble,
    double_in_this_process,
)
from tests.promtext import samples

UUID0 = "GPU-11111111-2222-4333-8444-555555555500"
UUID1 = "GPU-11111111-2222-4333-8444-555555555501"
GIB = 1 << 30


@pytest.fixture
def double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NvmlDouble:
    return double_in_this_process(
        tmp_path,
        monkeypatch,
        device_count=2,
        driver_version="535.129.03",
        cuda_version=12020,
        device__0__uuid=UUID0,
        device__0__name="NVIDIA A10",
        device__0__memory_bytes=24 * GIB,
        device__0__pci_bus_id="00000000:3B:00.0",
        device__0__utilization_gpu=40,
        device__1__uuid=UUID1,
        device__1__name="NVIDIA A100-SXM4-40GB",
        device__1__memory_bytes=40 * GIB,
        device__1__mig_mode=1,
    )


def test_discovery_reports_every_gpu(backend: PynvmlBackend) -> None:
    found = discover(backend)
    assert found.driver_version == "535.129.03"
    assert found.cuda_driver_version == "12.2"
    first, second = found.devices
    assert (first.uuid, first.index, first.model, first.memory_mib) == (
        UUID0,
        0,
        "NVIDIA A10",
        24576,
    )
    assert first.pci_bus_id == "00000000:3B:00.0"
    assert not first.mig_enabled
    assert (second.uuid, second.model, second.memory_mib) == (UUID1, "NVIDIA A100-SXM4-40GB", 40960)
    assert second.mig_enabled


def test_discovery_fails_loudly_when_nvml_fails(double: NvmlDouble) -> None:
    double.set("nvml_error.nvmlDeviceGetCount", 9)  # DRIVER_NOT_LOADED
    nvml = PynvmlBackend()
    try:
        with pytest.raises(NvmlError) as raised:
            discover(nvml)
        assert raised.value.code == 9
        assert "nvmlDeviceGetCount" in str(raised.value)
    finally:
        nvml.shutdown()


def _monitor(backend: PynvmlBackend, recovery: float = 0.0) -> HealthMonitor:
    return HealthMonitor(
        backend,
        [UUID0, UUID1],
        probe_seconds=0.05,
        xid_recovery_seconds=recovery,
        ignored_xids=(13, 31, 43, 45, 68, 109),
    )


def test_nvml_error_makes_a_gpu_unhealthy_until_it_answers(
    double: NvmlDouble, backend: PynvmlBackend
) -> None:
    discover(backend)
    monitor = _monitor(backend)
    monitor.probe_once()
    assert monitor.snapshot() == {UUID0: True, UUID1: True}
    double.set("device.1.nvml_error.nvmlDeviceGetMemoryInfo", 15)  # GPU_IS_LOST
    monitor.probe_once()
    assert monitor.snapshot() == {UUID0: True, UUID1: False}
    assert "GPU is lost" in monitor.reasons()[UUID1]
    double.set("device.1.nvml_error.nvmlDeviceGetMemoryInfo", None)
    monitor.probe_once()
    assert monitor.snapshot() == {UUID0: True, UUID1: True}


def test_critical_xid_marks_unhealthy_and_application_xids_do_not(
    double: NvmlDouble, backend: PynvmlBackend
) -> None:
    discover(backend)
    monitor = _monitor(backend, recovery=3600)
    changes: list[dict[str, bool]] = []
    changed = threading.Event()

    def listener(health: dict[str, bool]) -> None:
        changes.append(health)
        changed.set()

    monitor.add_listener(listener)
    monitor.start()
    try:
        assert monitor.xid_watch_ready.wait(10)
        double.xid(UUID0, 13)  # application fault: ignored
        double.xid(UUID0, 79)  # GPU fell off the bus
        assert changed.wait(10)
        assert changes[0] == {UUID0: False, UUID1: True}
        assert monitor.reasons() == {UUID0: "critical XID 79"}
    finally:
        monitor.stop()


def test_gpu_recovers_after_the_xid_quiet_period(
    double: NvmlDouble, backend: PynvmlBackend
) -> None:
    discover(backend)
    now = [1000.0]
    monitor = HealthMonitor(
        backend,
        [UUID0, UUID1],
        probe_seconds=1,
        xid_recovery_seconds=60,
        ignored_xids=(),
        clock=lambda: now[0],
    )
    monitor.record_xid(UUID1, 48)  # double-bit ECC error
    monitor.probe_once()
    assert monitor.snapshot()[UUID1] is False
    now[0] += 59
    monitor.probe_once()
    assert monitor.snapshot()[UUID1] is False
    now[0] += 2
    monitor.probe_once()
    assert monitor.snapshot()[UUID1] is True


def _scrape(collector: AgentCollector) -> dict[str, float]:
    return samples(generate_latest(build_registry(collector)).decode())


def test_gpu_metrics_come_from_nvml_and_the_live_containers(
    double: NvmlDouble, backend: PynvmlBackend
) -> None:
    found = discover(backend)
    health = {UUID0: True, UUID1: False}
    containers = [
        LiveContainer(
            "team-a",
            "train",
            "main",
            ("k1",),
            Limits((DeviceLimits(UUID0, 4 * GIB, 30),), namespace="team-a", pod="train"),
            None,
        ),
        LiveContainer(
            "team-b",
            "serve",
            "app",
            ("k2",),
            Limits((DeviceLimits(UUID0, 2 * GIB, 25),), namespace="team-b", pod="serve"),
            None,
        ),
    ]
    collector = AgentCollector(
        backend,
        lambda: found.devices,
        lambda: health,
        lambda: containers,
        node_name="gpu-node-7",
    )
    samples = _scrape(collector)
    # Every GPU series names its node.
    gpu0 = f'gpu="{UUID0}",index="0",model="NVIDIA A10",node="gpu-node-7"'
    gpu1 = f'gpu="{UUID1}",index="1",model="NVIDIA A100-SXM4-40GB",node="gpu-node-7"'
    assert samples[f"fracgpu_gpu_memory_total_bytes{{{gpu0}}}"] == 24 * GIB
    assert samples[f"fracgpu_gpu_utilization_ratio{{{gpu0}}}"] == pytest.approx(0.40)
    assert samples[f"fracgpu_gpu_healthy{{{gpu0}}}"] == 1
    assert samples[f"fracgpu_gpu_healthy{{{gpu1}}}"] == 0
    assert samples[f"fracgpu_gpu_allocated_compute_ratio{{{gpu0}}}"] == pytest.approx(0.55)
    assert samples[f"fracgpu_gpu_allocated_memory_bytes{{{gpu0}}}"] == 6 * GIB
    assert samples[f"fracgpu_gpu_containers{{{gpu0}}}"] == 2
    assert samples[f"fracgpu_gpu_containers{{{gpu1}}}"] == 0
    limit = f'container="main",gpu="{UUID0}",namespace="team-a",pod="train"'
    assert samples[f"fracgpu_container_memory_limit_bytes{{{limit}}}"] == 4 * GIB
    assert samples[f"fracgpu_container_compute_limit_ratio{{{limit}}}"] == pytest.approx(0.3)
    assert samples["fracgpu_agent_scrape_errors"] == 0

    # The second container stops: its series go away with it.
    containers.pop()
    samples = _scrape(collector)
    assert not any('pod="serve"' in name for name in samples)
    assert samples[f"fracgpu_gpu_containers{{{gpu0}}}"] == 1


def test_a_failing_gpu_query_is_counted_not_fatal(
    double: NvmlDouble, backend: PynvmlBackend
) -> None:
    found = discover(backend)
    collector = AgentCollector(backend, lambda: found.devices, dict, list)
    double.set("device.0.nvml_error.nvmlDeviceGetUtilizationRates", 15)
    samples = _scrape(collector)
    assert samples["fracgpu_agent_scrape_errors"] == 1
    assert not any(
        name.startswith("fracgpu_gpu_memory_total_bytes") and UUID0 in name for name in samples
    )
    assert any(
        name.startswith("fracgpu_gpu_memory_total_bytes") and UUID1 in name for name in samples
    )
