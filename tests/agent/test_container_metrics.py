"""Per-container metrics from a real shim: a workload process runs under the shim (test
build) on the CUDA and NVML doubles, with the limits file the agent wrote at its start; the
agent reads the accounting region the shim keeps and exports it."""

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from agent.containers import live_containers, remove_stale
from agent.hostfiles import allocation_key
from agent.metrics import AgentCollector, build_registry
from agent.nvml_backend import PynvmlBackend
from agent.podresources import PodResourcesClient
from fracgpu.model import GPUAllocation
from fracgpu.names import RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY
from tests.agent.conftest import GPU_A, GPU_B, AgentRig, assigned_pod
from tests.agent.kubelet import ContainerRef
from tests.agent.nvml_double import (
    SHIM_BUILD,
    NvmlDouble,
    ensure_shim_built,
    load_into_this_process,
)

GIB = 1 << 30
WORKLOAD = SHIM_BUILD / "tests" / "mem_ops"
SHIM_TEST_LIBRARY = SHIM_BUILD / "libfracgpu-test.so"


@pytest.fixture
def double(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> NvmlDouble:
    ensure_shim_built()
    load_into_this_process()
    fake = NvmlDouble(short_dir)
    fake.configure(
        device_count=2,
        device__0__uuid=GPU_A.uuid,
        device__0__memory_bytes=24 * GIB,
        device__1__uuid=GPU_B.uuid,
        device__1__memory_bytes=24 * GIB,
    )
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    return fake


@pytest.fixture
def backend(double: NvmlDouble) -> Iterator[PynvmlBackend]:
    nvml = PynvmlBackend()
    yield nvml
    nvml.shutdown()


def _samples(collector: AgentCollector) -> dict[str, float]:
    out = {}
    for line in generate_latest(build_registry(collector)).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_container_usage_and_ooms_from_the_shim_region(
    rig: AgentRig, double: NvmlDouble, backend: PynvmlBackend, short_dir: Path
) -> None:
    rig.pods.add(assigned_pod("train", {"main": [GPUAllocation(GPU_B.uuid, 30, 4096)]}))
    ref = ContainerRef("team-a", "train", "main")
    ids, reply = rig.kubelet.allocate(ref, RESOURCE_VCUDA_CORE, 30)
    rig.kubelet.pre_start(ref, RESOURCE_VCUDA_CORE)
    key = allocation_key(RESOURCE_VCUDA_CORE, ids)
    mounts = {m.container_path: m.host_path for m in reply.mounts}

    # The "container": a CUDA program under the shim, reading the mounted limits file and
    # keeping its region in the mounted run directory. It uses CUDA device 1, GPU B, the one
    # assigned (in a real container NVIDIA_VISIBLE_DEVICES shows it only its GPUs).
    env = {
        **os.environ,
        "LD_PRELOAD": str(SHIM_TEST_LIBRARY),
        "FRACGPU_TEST_LIMITS_PATH": mounts["/etc/fracgpu/limits"],
        "FRACGPU_TEST_REGION_PATH": str(Path(mounts["/var/run/fracgpu"]) / "region"),
    }
    workload = subprocess.Popen(
        [str(WORKLOAD), "ctx", "1", "alloc", "1Gi", "alloc", "8Gi", "sleep", "20000"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert workload.stdout is not None
        lines = [workload.stdout.readline().split() for _ in range(3)]
        assert lines[1][:2] == ["alloc", "0"]  # 1 GiB fits in the 4 GiB slice
        assert lines[2][:2] == ["alloc", "2"]  # 8 GiB does not: CUDA_ERROR_OUT_OF_MEMORY

        pod_resources = PodResourcesClient(short_dir / "pr.sock")
        resources = (RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY)
        collector = AgentCollector(
            backend,
            lambda: rig.state.gpus().values(),
            lambda: {},
            lambda: live_containers(pod_resources, resources, rig.files),
        )
        samples = _samples(collector)
        labels = f'container="main",gpu="{GPU_B.uuid}",namespace="team-a",pod="train"'
        assert samples[f"fracgpu_container_memory_used_bytes{{{labels}}}"] == GIB
        assert samples[f"fracgpu_container_memory_limit_bytes{{{labels}}}"] == 4 * GIB
        assert samples[f"fracgpu_container_compute_limit_ratio{{{labels}}}"] == pytest.approx(0.3)
        assert samples[f"fracgpu_container_oom_rejections_total{{{labels}}}"] == 1
        gpu_b = f'gpu="{GPU_B.uuid}",index="1",model="NVIDIA A10"'
        assert samples[f"fracgpu_gpu_allocated_memory_bytes{{{gpu_b}}}"] == 4 * GIB
        assert samples[f"fracgpu_gpu_containers{{{gpu_b}}}"] == 1
    finally:
        workload.kill()
        workload.wait()
        if workload.stdout is not None:
            workload.stdout.close()

    # The pod ends: kubelet frees its devices; its series vanish and its files are cleaned.
    rig.kubelet.release(ref)
    samples = _samples(collector)
    assert not any('pod="train"' in name for name in samples)
    assert samples[f"fracgpu_gpu_containers{{{gpu_b}}}"] == 0
    assert rig.files.directory(key).exists()
    removed = remove_stale(rig.files, [], grace_seconds=0)
    assert key in removed and not rig.files.directory(key).exists()


def test_container_utilization_follows_its_paced_kernels(
    rig: AgentRig, double: NvmlDouble, backend: PynvmlBackend, short_dir: Path
) -> None:
    rig.pods.add(assigned_pod("infer", {"main": [GPUAllocation(GPU_A.uuid, 30, 2048)]}))
    ref = ContainerRef("team-a", "infer", "main")
    _, reply = rig.kubelet.allocate(ref, RESOURCE_VCUDA_CORE, 30)
    rig.kubelet.pre_start(ref, RESOURCE_VCUDA_CORE)
    mounts = {m.container_path: m.host_path for m in reply.mounts}
    region = Path(mounts["/var/run/fracgpu"]) / "region"
    env = {
        **os.environ,
        "LD_PRELOAD": str(SHIM_TEST_LIBRARY),
        "FRACGPU_TEST_LIMITS_PATH": mounts["/etc/fracgpu/limits"],
        "FRACGPU_TEST_REGION_PATH": str(region),
    }
    # 1 ms kernels back to back on CUDA device 0 (GPU A) for 6 s; the shim paces them to 30 %.
    workload = subprocess.Popen(
        [str(SHIM_BUILD / "tests" / "launch_ops"), "1000", "6", "launch"],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        pod_resources = PodResourcesClient(short_dir / "pr.sock")
        collector = AgentCollector(
            backend,
            lambda: rig.state.gpus().values(),
            lambda: {},
            lambda: live_containers(
                pod_resources, (RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY), rig.files
            ),
        )
        for _ in range(100):
            if region.exists():
                break
            time.sleep(0.05)
        labels = f'container="main",gpu="{GPU_A.uuid}",namespace="team-a",pod="infer"'
        name = f"fracgpu_container_utilization_ratio{{{labels}}}"
        assert name not in _samples(collector)  # one sample is not yet a rate
        time.sleep(1.5)
        utilization = _samples(collector)[name]
        assert 0.05 <= utilization <= 0.45  # paced to its 30 % (unpaced would be near 1)
    finally:
        workload.kill()
        workload.wait()
