"""Per-container metrics from a real shim: a workload process runs under the shim (test
build) on the CUDA and NVML doubles, with the limits file the agent wrote at its start; the
agent reads the accounting region the shim keeps and exports it."""

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from agent.containers import LiveContainer, live_containers, remove_stale
from agent.hostfiles import allocation_key
from agent.metrics import AgentCollector, build_registry
from agent.nvml_backend import PynvmlBackend
from agent.podresources import PodResourcesClient
from agent.settings import AgentSettings, SettingsError, parse_settings
from fracgpu import names
from fracgpu.model import GPUAllocation
from fracgpu.names import RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY
from fracgpu.shim_abi import decode_limits
from tests.agent.conftest import GPU_A, GPU_B, AgentRig, assigned_pod
from tests.agent.kubelet import ContainerRef
from tests.agent.nvml_double import (
    SHIM_BUILD,
    NvmlDouble,
    double_in_this_process,
)
from tests.promtext import samples

GIB = 1 << 30
WORKLOAD = SHIM_BUILD / "tests" / "mem_ops"
LAUNCHER = SHIM_BUILD / "tests" / "launch_ops"
SHIM_TEST_LIBRARY = SHIM_BUILD / "libfracgpu-test.so"


@pytest.fixture
def double(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> NvmlDouble:
    return double_in_this_process(
        short_dir,
        monkeypatch,
        device_count=2,
        device__0__uuid=GPU_A.uuid,
        device__0__memory_bytes=24 * GIB,
        device__1__uuid=GPU_B.uuid,
        device__1__memory_bytes=24 * GIB,
    )


def _samples(collector: AgentCollector) -> dict[str, float]:
    return samples(generate_latest(build_registry(collector)).decode())


@dataclass(frozen=True)
class Started:
    """A container kubelet allocated and started: where its files are mounted from."""

    ref: ContainerRef
    key: str  # its first allocation's directory
    limits: Path
    region: Path

    def shim_env(self) -> dict[str, str]:
        """The environment of a process in it: the shim, reading the mounted files."""
        return {
            **os.environ,
            "LD_PRELOAD": str(SHIM_TEST_LIBRARY),
            "FRACGPU_TEST_LIMITS_PATH": str(self.limits),
            "FRACGPU_TEST_REGION_PATH": str(self.region),
        }


def _start(rig: AgentRig, pod: str, alloc: GPUAllocation, memory_scaling: float = 1.0) -> Started:
    """Kubelet's part for container "main" of a team-a pod: allocate both canonical
    resources as the webhook wrote them (none for compute when best effort), then start it."""
    info = assigned_pod(pod, {"main": [alloc]}, memory_scaling=memory_scaling)
    rig.pods.add(info)
    ref = ContainerRef("team-a", pod, "main")
    replies = []
    if alloc.cores:
        ids, reply = rig.kubelet.allocate(ref, RESOURCE_VCUDA_CORE, alloc.cores)
        replies.append((allocation_key(RESOURCE_VCUDA_CORE, ids), reply))
    ids, reply = rig.kubelet.allocate(ref, RESOURCE_VCUDA_MEMORY, alloc.memory_mib // 256)
    replies.append((allocation_key(RESOURCE_VCUDA_MEMORY, ids), reply))
    rig.kubelet.pre_start(ref, RESOURCE_VCUDA_CORE if alloc.cores else RESOURCE_VCUDA_MEMORY)
    key, first = replies[0]
    mounts = {m.container_path: m.host_path for m in first.mounts}
    return Started(
        ref,
        key,
        Path(mounts[names.CONTAINER_LIMITS_PATH]),
        rig.region(info, "main"),
    )


@contextmanager
def _running(argv: list[str], started: Started, lines: int = 0) -> Iterator[list[list[str]]]:
    """A workload process in the container; yields its first ``lines`` output lines split."""
    workload = subprocess.Popen(argv, env=started.shim_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert workload.stdout is not None
        yield [workload.stdout.readline().split() for _ in range(lines)]
    finally:
        workload.kill()
        workload.wait()
        if workload.stdout is not None:
            workload.stdout.close()


def _collector(
    rig: AgentRig, backend: PynvmlBackend, short_dir: Path, **options: Any
) -> AgentCollector:
    pod_resources = PodResourcesClient(short_dir / "pr.sock")
    resources = (RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY)
    return AgentCollector(
        backend,
        lambda: rig.state.gpus().values(),
        lambda: {},
        lambda: live_containers(pod_resources, resources, rig.files),
        **options,
    )


def _wait_for(path: Path) -> None:
    for _ in range(100):
        if path.exists():
            return
        time.sleep(0.05)


def test_container_usage_and_ooms_from_the_shim_region(
    rig: AgentRig, double: NvmlDouble, backend: PynvmlBackend, short_dir: Path
) -> None:
    # The "container": a CUDA program under the shim, reading the mounted limits file and
    # keeping its region in the mounted run directory. It uses CUDA device 1, GPU B, the one
    # assigned (in a real container NVIDIA_VISIBLE_DEVICES shows it only its GPUs).
    started = _start(rig, "train", GPUAllocation(GPU_B.uuid, 30, 4096))
    argv = [str(WORKLOAD), "ctx", "1", "alloc", "1Gi", "alloc", "8Gi", "sleep", "20000"]
    collector = _collector(rig, backend, short_dir)
    gpu_b = f'gpu="{GPU_B.uuid}",index="1",model="NVIDIA A10",node=""'
    with _running(argv, started, lines=3) as lines:
        assert lines[1][:2] == ["alloc", "0"]  # 1 GiB fits in the 4 GiB slice
        assert lines[2][:2] == ["alloc", "2"]  # 8 GiB does not: CUDA_ERROR_OUT_OF_MEMORY
        samples = _samples(collector)
        labels = f'container="main",gpu="{GPU_B.uuid}",namespace="team-a",pod="train"'
        assert samples[f"fracgpu_container_memory_used_bytes{{{labels}}}"] == GIB
        assert samples[f"fracgpu_container_memory_limit_bytes{{{labels}}}"] == 4 * GIB
        assert samples[f"fracgpu_container_compute_limit_ratio{{{labels}}}"] == pytest.approx(0.3)
        assert samples[f"fracgpu_container_oom_rejections_total{{{labels}}}"] == 1
        assert samples[f"fracgpu_container_memory_host_bytes{{{labels}}}"] == 0
        assert samples[f"fracgpu_container_memory_host_allocations_total{{{labels}}}"] == 0
        assert samples[f"fracgpu_gpu_allocated_memory_bytes{{{gpu_b}}}"] == 4 * GIB
        assert samples[f"fracgpu_gpu_containers{{{gpu_b}}}"] == 1

    # The pod ends: kubelet frees its devices; its series vanish and its files are cleaned.
    rig.kubelet.release(started.ref)
    samples = _samples(collector)
    assert not any('pod="train"' in name for name in samples)
    assert samples[f"fracgpu_gpu_containers{{{gpu_b}}}"] == 0
    assert rig.files.directory(started.key).exists()
    removed = remove_stale(rig.files, [], grace_seconds=0)
    assert started.key in removed and not rig.files.directory(started.key).exists()


def test_host_backed_memory_of_a_container_on_a_full_gpu(
    rig: AgentRig, double: NvmlDouble, backend: PynvmlBackend, short_dir: Path
) -> None:
    # The node oversubscribes GPU memory (memory scaling 2, so the agent turns host fallback
    # on), and GPU B has only 2 GiB left for this 4 GiB slice.
    started = _start(rig, "spill", GPUAllocation(GPU_B.uuid, 30, 4096), memory_scaling=2.0)
    assert decode_limits(started.limits.read_bytes()).memory_host_fallback
    double.set("device.1.memory_bytes", 2 * GIB)
    # 1 GiB fits on the GPU, the next 2 GiB only within the slice: they come from the host.
    argv = [str(WORKLOAD), "ctx", "1", "alloc", "1Gi", "alloc", "2Gi", "sleep", "20000"]
    with _running(argv, started, lines=3) as lines:
        assert [line[:2] for line in lines[1:]] == [["alloc", "0"], ["alloc", "0"]]
        samples = _samples(_collector(rig, backend, short_dir))
        labels = f'container="main",gpu="{GPU_B.uuid}",namespace="team-a",pod="spill"'
        assert samples[f"fracgpu_container_memory_used_bytes{{{labels}}}"] == 3 * GIB
        assert samples[f"fracgpu_container_memory_host_bytes{{{labels}}}"] == 2 * GIB
        assert samples[f"fracgpu_container_memory_host_allocations_total{{{labels}}}"] == 1
        assert samples[f"fracgpu_container_oom_rejections_total{{{labels}}}"] == 0


def test_container_utilization_follows_its_paced_kernels(
    rig: AgentRig, double: NvmlDouble, backend: PynvmlBackend, short_dir: Path
) -> None:
    started = _start(rig, "infer", GPUAllocation(GPU_A.uuid, 30, 2048))
    collector = _collector(rig, backend, short_dir)
    # 1 ms kernels back to back on CUDA device 0 (GPU A) for 6 s; the shim paces them to 30 %.
    with _running([str(LAUNCHER), "1000", "6", "launch"], started):
        _wait_for(started.region)
        labels = f'container="main",gpu="{GPU_A.uuid}",namespace="team-a",pod="infer"'
        name = f"fracgpu_container_utilization_ratio{{{labels}}}"
        assert name not in _samples(collector)  # one sample is not yet a rate
        time.sleep(1.5)
        utilization = _samples(collector)[name]
        assert 0.05 <= utilization <= 0.45  # paced to its 30 % (unpaced would be near 1)


MIB = 1 << 20


def _series(name: str, **labels: str) -> str:
    """A series as the exposition format writes it (labels sorted by name)."""
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _gpu_manager_labels(pod: str) -> dict[str, str]:
    """gpu-manager's labels for container "main" of a team-a pod on node gpu-7."""
    return {"pod_name": pod, "namespace": "team-a", "node": "gpu-7", "container_name": "main"}


def _gpu_manager_series(samples: dict[str, float]) -> dict[str, float]:
    names = (
        "container_gpu_utilization{",
        "container_gpu_memory_total{",
        "container_request_gpu_memory{",
        "container_request_gpu_utilization{",
    )
    return {name: value for name, value in samples.items() if name.startswith(names)}


def test_gpu_manager_metrics_setting_from_flag_and_environment() -> None:
    assert not parse_settings([], env={"NODE_NAME": "n"}).gpu_manager_metrics
    env = {"NODE_NAME": "n", "FRACGPU_AGENT_GPU_MANAGER_METRICS": "true"}
    assert parse_settings([], env=env).gpu_manager_metrics
    assert not parse_settings(["--gpu-manager-metrics=false"], env=env).gpu_manager_metrics
    assert parse_settings(["--node-name=n", "--gpu-manager-metrics"], env={}).gpu_manager_metrics
    with pytest.raises(SettingsError, match="--gpu-manager-metrics=maybe is not allowed"):
        parse_settings(["--node-name=n", "--gpu-manager-metrics=maybe"], env={})


def test_gpu_manager_names_mirror_the_container_metrics(
    rig: AgentRig, double: NvmlDouble, backend: PynvmlBackend, short_dir: Path
) -> None:
    started = _start(rig, "train", GPUAllocation(GPU_B.uuid, 30, 4096))

    def collector(settings: AgentSettings) -> AgentCollector:
        return _collector(
            rig,
            backend,
            short_dir,
            gpu_manager_metrics=settings.gpu_manager_metrics,
            node_name=settings.node_name,
        )

    on = collector(
        parse_settings([], env={"NODE_NAME": "gpu-7", "FRACGPU_AGENT_GPU_MANAGER_METRICS": "1"})
    )
    off = collector(parse_settings([], env={"NODE_NAME": "gpu-7"}))
    argv = [str(WORKLOAD), "ctx", "1", "alloc", "3Gi", "sleep", "20000"]
    with _running(argv, started, lines=2) as lines:
        assert lines[1][:2] == ["alloc", "0"]
        _samples(on)  # the first scrape is the kernel-time baseline of the utilization rate
        samples = _samples(on)
        ours = f'container="main",gpu="{GPU_B.uuid}",namespace="team-a",pod="train"'
        theirs = _gpu_manager_labels("train")
        used = samples[f"fracgpu_container_memory_used_bytes{{{ours}}}"]
        limit = samples[f"fracgpu_container_memory_limit_bytes{{{ours}}}"]
        compute = samples[f"fracgpu_container_compute_limit_ratio{{{ours}}}"]
        busy = samples[f"fracgpu_container_utilization_ratio{{{ours}}}"]
        assert used == 3 * GIB
        assert limit == 4 * GIB
        assert compute == pytest.approx(0.3)
        # GPU B is index 1: gpu-manager names it gpu1, and adds a "total" series.
        assert _gpu_manager_series(samples) == {
            _series("container_gpu_memory_total", **theirs, gpu_memory="gpu1"): used / MIB,
            _series("container_gpu_memory_total", **theirs, gpu_memory="total"): used / MIB,
            _series("container_gpu_utilization", **theirs, gpu="gpu1"): busy * 100,
            _series("container_gpu_utilization", **theirs, gpu="total"): busy * 100,
            _series("container_request_gpu_memory", **theirs, req_of_gpu_memory="total"): (
                limit / MIB
            ),
            _series("container_request_gpu_utilization", **theirs, req_of_gpu="total"): compute,
        }
        # Off (the default): the fracgpu series are there, the gpu-manager names are not.
        plain = _samples(off)
        assert plain.get(f"fracgpu_container_memory_used_bytes{{{ours}}}") == 3 * GIB
        assert not [name for name in plain if name.startswith("container_")]

    # The pod ends: its gpu-manager series vanish with the fracgpu ones.
    rig.kubelet.release(started.ref)
    assert _gpu_manager_series(_samples(on)) == {}


def test_gpu_manager_utilization_is_the_paced_kernel_time_in_percent(
    rig: AgentRig, double: NvmlDouble, backend: PynvmlBackend, short_dir: Path
) -> None:
    started = _start(rig, "infer", GPUAllocation(GPU_A.uuid, 30, 2048))
    collector = _collector(rig, backend, short_dir, gpu_manager_metrics=True, node_name="gpu-7")
    with _running([str(LAUNCHER), "1000", "5", "launch"], started):
        _wait_for(started.region)
        theirs = _gpu_manager_labels("infer")
        per_gpu = _series("container_gpu_utilization", **theirs, gpu="gpu0")
        assert per_gpu not in _samples(collector)  # one sample is not yet a rate
        time.sleep(1.5)
        samples = _samples(collector)
        ours = f'container="main",gpu="{GPU_A.uuid}",namespace="team-a",pod="infer"'
        ratio = samples[f"fracgpu_container_utilization_ratio{{{ours}}}"]
        assert 0.05 <= ratio <= 0.45  # paced to its 30 %
        assert samples[per_gpu] == pytest.approx(ratio * 100)
        total = _series("container_gpu_utilization", **theirs, gpu="total")
        assert samples[total] == samples[per_gpu]


def test_gpu_manager_request_is_what_was_promised_not_the_pacing(
    rig: AgentRig, double: NvmlDouble, backend: PynvmlBackend, short_dir: Path
) -> None:
    # A memory-only (best effort) container runs unpaced but was promised no compute:
    # gpu-manager reports its vcuda-core request, 0, where fracgpu's pacing ratio reads 1.
    _start(rig, "notebook", GPUAllocation(GPU_A.uuid, 0, 2048))
    collector = _collector(rig, backend, short_dir, gpu_manager_metrics=True, node_name="gpu-7")
    samples = _samples(collector)
    ours = f'container="main",gpu="{GPU_A.uuid}",namespace="team-a",pod="notebook"'
    assert samples[f"fracgpu_container_compute_limit_ratio{{{ours}}}"] == 1
    theirs = _gpu_manager_labels("notebook")
    # No region yet (nothing ran): only the request series, from the limits file.
    assert _gpu_manager_series(samples) == {
        _series("container_request_gpu_utilization", **theirs, req_of_gpu="total"): 0,
        _series("container_request_gpu_memory", **theirs, req_of_gpu_memory="total"): 2048,
    }


def test_a_scrape_stuck_reading_container_files_does_not_hold_up_the_next(
    backend: PynvmlBackend,
) -> None:
    """Reading containers' files happens outside the collector's lock: one scrape stuck on
    a slow or hostile file does not make every later scrape wait behind it."""
    release = threading.Event()
    calls: list[int] = []

    def containers() -> list[LiveContainer]:
        calls.append(1)
        if len(calls) == 1:
            release.wait(30)  # the first scrape is stuck in a container's file
        return []

    collector = AgentCollector(backend, lambda: [], dict, containers)
    stuck = threading.Thread(target=lambda: list(collector.collect()), daemon=True)
    stuck.start()
    while not calls:
        time.sleep(0.01)
    second = threading.Thread(target=lambda: list(collector.collect()), daemon=True)
    second.start()
    second.join(timeout=5)
    blocked = second.is_alive()
    release.set()
    stuck.join(timeout=5)
    assert not blocked, "the second scrape waited for the first one's file reads"
