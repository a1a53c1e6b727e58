"""Prometheus metrics, computed at scrape time so that gone containers simply disappear.

Per GPU (labels gpu, index, model) from NVML, the health monitor and the live containers'
limits; per container (labels namespace, pod, container, gpu) from the shim's accounting
region and limits file. See docs/agent.md for the list.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.containers import LiveContainer
from agent.nvml_backend import NvmlBackend, NvmlError
from fracgpu.model import GPUDevice
from fracgpu.names import CORES_PER_GPU
from fracgpu.shim_abi import Limits

log = logging.getLogger(__name__)

_GPU_LABELS = ("gpu", "index", "model")
_CONTAINER_LABELS = ("namespace", "pod", "container", "gpu")


@dataclass(frozen=True)
class _KernelSample:
    kernel_time_ns: int
    at_ns: int


class AgentCollector(Collector):
    def __init__(
        self,
        backend: NvmlBackend,
        gpus: Callable[[], Iterable[GPUDevice]],
        health: Callable[[], dict[str, bool]],
        containers: Callable[[], list[LiveContainer]],
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._backend = backend
        self._gpus = gpus
        self._health = health
        self._containers = containers
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        # Previous kernel-time sample per (namespace, pod, container, gpu): utilization is
        # the share of wall time spent in kernels between two scrapes.
        self._samples: dict[tuple[str, str, str, str], _KernelSample] = {}

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._collect()

    def _collect(self) -> Iterator[Metric]:
        gpus = list(self._gpus())
        health = self._health()
        scrape_errors = 0
        try:
            containers = self._containers()
        except Exception as error:  # kubelet down: GPU metrics still count
            log.warning("listing live containers failed", extra={"error": str(error)})
            containers = []
            scrape_errors += 1

        mem_used = GaugeMetricFamily(
            "fracgpu_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=_GPU_LABELS
        )
        mem_total = GaugeMetricFamily(
            "fracgpu_gpu_memory_total_bytes", "GPU memory in total (NVML).", labels=_GPU_LABELS
        )
        util = GaugeMetricFamily(
            "fracgpu_gpu_utilization_ratio",
            "Share of time the GPU ran kernels over NVML's last sample period (0-1).",
            labels=_GPU_LABELS,
        )
        healthy = GaugeMetricFamily(
            "fracgpu_gpu_healthy", "1 when the GPU is healthy, 0 when not.", labels=_GPU_LABELS
        )
        alloc_compute = GaugeMetricFamily(
            "fracgpu_gpu_allocated_compute_ratio",
            "Compute promised to running containers, as a share of the GPU (1 = whole GPU).",
            labels=_GPU_LABELS,
        )
        alloc_memory = GaugeMetricFamily(
            "fracgpu_gpu_allocated_memory_bytes",
            "GPU memory promised to running containers.",
            labels=_GPU_LABELS,
        )
        alloc_containers = GaugeMetricFamily(
            "fracgpu_gpu_containers", "Running fracgpu containers on the GPU.", labels=_GPU_LABELS
        )

        cores: dict[str, int] = {}
        memory: dict[str, int] = {}
        count: dict[str, int] = {}
        for c in containers:
            for uuid, (mem_limit, reserved, _paced) in _slices(c.limits).items():
                cores[uuid] = cores.get(uuid, 0) + reserved
                memory[uuid] = memory.get(uuid, 0) + mem_limit
                count[uuid] = count.get(uuid, 0) + 1

        for gpu in gpus:
            labels = [gpu.uuid, str(gpu.index), gpu.model]
            healthy.add_metric(labels, 1.0 if health.get(gpu.uuid, gpu.healthy) else 0.0)
            alloc_compute.add_metric(labels, cores.get(gpu.uuid, 0) / CORES_PER_GPU)
            alloc_memory.add_metric(labels, memory.get(gpu.uuid, 0))
            alloc_containers.add_metric(labels, count.get(gpu.uuid, 0))
            try:
                usage = self._backend.device_usage(gpu.uuid)
            except NvmlError as error:
                log.warning("NVML usage query failed", extra={"gpu": gpu.uuid, "error": str(error)})
                scrape_errors += 1
                continue
            mem_used.add_metric(labels, usage.memory_used_bytes)
            mem_total.add_metric(labels, usage.memory_total_bytes)
            util.add_metric(labels, usage.utilization_percent / 100.0)

        yield from (mem_used, mem_total, util, healthy, alloc_compute, alloc_memory)
        yield alloc_containers
        yield from self._container_metrics(containers)
        errors = GaugeMetricFamily(
            "fracgpu_agent_scrape_errors",
            "Sources (NVML queries, kubelet) that failed during this scrape.",
        )
        errors.add_metric([], scrape_errors)
        yield errors

    def _container_metrics(self, containers: list[LiveContainer]) -> Iterator[Metric]:
        used = GaugeMetricFamily(
            "fracgpu_container_memory_used_bytes",
            "GPU memory the container holds (shim accounting).",
            labels=_CONTAINER_LABELS,
        )
        limit = GaugeMetricFamily(
            "fracgpu_container_memory_limit_bytes",
            "GPU memory the container may hold.",
            labels=_CONTAINER_LABELS,
        )
        compute = GaugeMetricFamily(
            "fracgpu_container_compute_limit_ratio",
            "Share of the GPU's compute the container is paced to (1 = whole GPU).",
            labels=_CONTAINER_LABELS,
        )
        util = GaugeMetricFamily(
            "fracgpu_container_utilization_ratio",
            "Share of wall time the container's kernels ran on the GPU since the last scrape.",
            labels=_CONTAINER_LABELS,
        )
        ooms = CounterMetricFamily(
            "fracgpu_container_oom_rejections",
            "Allocations the shim refused because they would pass the memory limit.",
            labels=_CONTAINER_LABELS,
        )
        now = self._clock_ns()
        seen: set[tuple[str, str, str, str]] = set()
        for c in containers:
            slices = _slices(c.limits)
            region = {d.uuid: d for d in c.region or ()}
            for uuid in sorted(set(slices) | set(region)):
                labels = [c.namespace, c.pod, c.container, uuid]
                mem_limit, _reserved, paced = slices.get(uuid, (0, 0, CORES_PER_GPU))
                dev = region.get(uuid)
                limit.add_metric(labels, mem_limit or (dev.memory_limit if dev else 0))
                compute.add_metric(labels, paced / CORES_PER_GPU)
                if dev is None:
                    continue
                used.add_metric(labels, dev.memory_used)
                ooms.add_metric(labels, dev.oom_rejections)
                key = (c.namespace, c.pod, c.container, uuid)
                seen.add(key)
                previous = self._samples.get(key)
                self._samples[key] = _KernelSample(dev.kernel_time_ns, now)
                if previous is not None and now > previous.at_ns:
                    busy = max(0, dev.kernel_time_ns - previous.kernel_time_ns)
                    util.add_metric(labels, min(1.0, busy / (now - previous.at_ns)))
        for key in set(self._samples) - seen:
            del self._samples[key]
        yield from (used, limit, compute, util, ooms)


def _slices(limits: Limits | None) -> dict[str, tuple[int, int, int]]:
    """Per GPU: (memory limit bytes, cores reserved, cores the shim paces to)."""
    if limits is None:
        return {}
    out = {}
    for dev in limits.devices:
        # Best effort (compute limiting off, not a whole GPU) reserves no compute and runs
        # unpaced; everything else reserves and is paced to its core limit.
        best_effort = not limits.whole and not limits.compute_limit_enabled
        reserved = 0 if best_effort else dev.core_limit
        paced = CORES_PER_GPU if not limits.compute_limit_enabled else dev.core_limit
        out[dev.uuid] = (dev.memory_limit_bytes, reserved, paced)
    return out


def build_registry(collector: AgentCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
