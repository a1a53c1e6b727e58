"""Prometheus metrics, computed at scrape time so that gone containers simply disappear.

Per GPU (labels node, gpu, index, model) from NVML, the health monitor and the live containers'
limits; per container (labels namespace, pod, container, gpu) from the shim's accounting
region and limits file. Optionally also TKEStack gpu-manager's container metric names and
labels, from the same data, so its dashboards keep working. See docs/agent.md for the list.
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

# node: this agent's node, so that a GPU's series say where it is whatever the scrape
# configuration's target labels are (a UUID alone does not tell an operator where to look).
_GPU_LABELS = ("node", "gpu", "index", "model")
_CONTAINER_LABELS = ("namespace", "pod", "container", "gpu")
# TKEStack gpu-manager's labels (pkg/services/display/display.go); each metric adds one more.
_GPU_MANAGER_LABELS = ("pod_name", "namespace", "node", "container_name")
_MIB = 1 << 20


@dataclass(frozen=True)
class _KernelSample:
    kernel_time_ns: int
    at_ns: int


@dataclass
class _ContainerGpu:
    """What one scrape knows about one container on one GPU; None: not known yet."""

    namespace: str
    pod: str
    container: str
    gpu: str
    memory_limit_bytes: int
    compute_limit_ratio: float  # what the shim paces to (1 when compute limiting is off)
    reserved_compute_ratio: float  # what the container was promised (0 for best effort)
    memory_used_bytes: int | None = None
    memory_host_bytes: int | None = None  # the part of memory_used_bytes held in host memory
    host_allocations: int | None = None
    oom_rejections: int | None = None
    utilization_ratio: float | None = None


class AgentCollector(Collector):
    def __init__(
        self,
        backend: NvmlBackend,
        gpus: Callable[[], Iterable[GPUDevice]],
        health: Callable[[], dict[str, bool]],
        containers: Callable[[], list[LiveContainer]],
        clock_ns: Callable[[], int] = time.monotonic_ns,
        *,
        gpu_manager_metrics: bool = False,
        node_name: str = "",
    ) -> None:
        self._backend = backend
        self._gpus = gpus
        self._health = health
        self._containers = containers
        self._clock_ns = clock_ns
        # Also export TKEStack gpu-manager's names. The node's name labels the GPU series
        # (and gpu-manager's).
        self._gpu_manager_metrics = gpu_manager_metrics
        self._node_name = node_name
        self._lock = threading.Lock()
        # Previous kernel-time sample per (namespace, pod, container, gpu): utilization is
        # the share of wall time spent in kernels between two scrapes.
        self._samples: dict[tuple[str, str, str, str], _KernelSample] = {}

    def collect(self) -> Iterator[Metric]:
        # Listing containers reads their files (container-writable): never under the lock,
        # so one slow or hostile file cannot hold up other scrapes behind it.
        scrape_errors = 0
        try:
            containers = self._containers()
        except Exception as error:  # kubelet down: GPU metrics still count
            log.warning("listing live containers failed", extra={"error": str(error)})
            containers = []
            scrape_errors += 1
        with self._lock:
            metrics = list(self._collect(containers, scrape_errors))
        yield from metrics

    def _collect(self, containers: list[LiveContainer], scrape_errors: int) -> Iterator[Metric]:
        gpus = list(self._gpus())
        health = self._health()

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
            labels = [self._node_name, gpu.uuid, str(gpu.index), gpu.model]
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
        yield from self._container_metrics(containers, {g.uuid: g.index for g in gpus})
        errors = GaugeMetricFamily(
            "fracgpu_agent_scrape_errors",
            "Sources (NVML queries, kubelet) that failed during this scrape.",
        )
        errors.add_metric([], scrape_errors)
        yield errors

    def _container_metrics(
        self, containers: list[LiveContainer], gpu_index: dict[str, int]
    ) -> Iterator[Metric]:
        rows = self._container_rows(containers)
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
        host = GaugeMetricFamily(
            "fracgpu_container_memory_host_bytes",
            "Part of the container's GPU memory served from host memory because the GPU was"
            " full (shim host fallback; counted in memory_used_bytes too).",
            labels=_CONTAINER_LABELS,
        )
        host_allocations = CounterMetricFamily(
            "fracgpu_container_memory_host_allocations",
            "Allocations the shim served from host memory because the GPU was full.",
            labels=_CONTAINER_LABELS,
        )
        for row in rows:
            labels = [row.namespace, row.pod, row.container, row.gpu]
            limit.add_metric(labels, row.memory_limit_bytes)
            compute.add_metric(labels, row.compute_limit_ratio)
            if row.memory_used_bytes is not None:
                used.add_metric(labels, row.memory_used_bytes)
            if row.memory_host_bytes is not None:
                host.add_metric(labels, row.memory_host_bytes)
            if row.host_allocations is not None:
                host_allocations.add_metric(labels, row.host_allocations)
            if row.oom_rejections is not None:
                ooms.add_metric(labels, row.oom_rejections)
            if row.utilization_ratio is not None:
                util.add_metric(labels, row.utilization_ratio)
        yield from (used, limit, compute, util, ooms, host, host_allocations)
        if self._gpu_manager_metrics:
            yield from _gpu_manager_metrics(rows, gpu_index, self._node_name)

    def _container_rows(self, containers: list[LiveContainer]) -> list[_ContainerGpu]:
        """One row per container and GPU of its limits file, with use from its region."""
        now = self._clock_ns()
        rows = []
        seen: set[tuple[str, str, str, str]] = set()
        for c in containers:
            # The GPUs and limits are the agent's (the limits file); the region, which the
            # container writes, only says how much of them it uses.
            slices = _slices(c.limits)
            region = {d.uuid: d for d in c.region or ()}
            for uuid in sorted(slices):
                mem_limit, reserved, paced = slices[uuid]
                dev = region.get(uuid)
                row = _ContainerGpu(
                    namespace=c.namespace,
                    pod=c.pod,
                    container=c.container,
                    gpu=uuid,
                    memory_limit_bytes=mem_limit,
                    compute_limit_ratio=paced / CORES_PER_GPU,
                    reserved_compute_ratio=reserved / CORES_PER_GPU,
                )
                rows.append(row)
                if dev is None:
                    continue
                row.memory_used_bytes = dev.memory_used
                row.memory_host_bytes = dev.memory_host_used
                row.host_allocations = dev.host_allocations
                row.oom_rejections = dev.oom_rejections
                key = (c.namespace, c.pod, c.container, uuid)
                seen.add(key)
                previous = self._samples.get(key)
                self._samples[key] = _KernelSample(dev.kernel_time_ns, now)
                if previous is not None and now > previous.at_ns:
                    busy = max(0, dev.kernel_time_ns - previous.kernel_time_ns)
                    row.utilization_ratio = min(1.0, busy / (now - previous.at_ns))
        for key in set(self._samples) - seen:
            del self._samples[key]
        return rows


def _gpu_manager_metrics(
    rows: list[_ContainerGpu], gpu_index: dict[str, int], node: str
) -> Iterator[Metric]:
    """TKEStack gpu-manager's container metrics, from the same rows, in its units.

    Per GPU and a "total" series: utilization in percent, memory used in MiB; per container
    ("total" only): requested compute in GPUs, requested memory in MiB.
    """
    util = GaugeMetricFamily(
        "container_gpu_utilization",
        "GPU utilization in percent (gpu-manager compatible; per GPU and total).",
        labels=(*_GPU_MANAGER_LABELS, "gpu"),
    )
    memory = GaugeMetricFamily(
        "container_gpu_memory_total",
        "GPU memory in use in MiB (gpu-manager compatible; per GPU and total).",
        labels=(*_GPU_MANAGER_LABELS, "gpu_memory"),
    )
    request_util = GaugeMetricFamily(
        "container_request_gpu_utilization",
        "Compute requested, in GPUs (gpu-manager compatible).",
        labels=(*_GPU_MANAGER_LABELS, "req_of_gpu"),
    )
    request_memory = GaugeMetricFamily(
        "container_request_gpu_memory",
        "GPU memory requested in MiB (gpu-manager compatible).",
        labels=(*_GPU_MANAGER_LABELS, "req_of_gpu_memory"),
    )
    by_container: dict[tuple[str, str, str], list[_ContainerGpu]] = {}
    for row in rows:
        by_container.setdefault((row.namespace, row.pod, row.container), []).append(row)
    for (namespace, pod, container), gpus in by_container.items():
        # gpu-manager's label order: pod_name, namespace, node, container_name.
        base = [pod, namespace, node, container]
        used = [r for r in gpus if r.memory_used_bytes is not None]
        for r in used:
            mib = (r.memory_used_bytes or 0) / _MIB
            memory.add_metric([*base, _gpu_manager_gpu(r.gpu, gpu_index)], mib)
        if used:
            total = sum(r.memory_used_bytes or 0 for r in used) / _MIB
            memory.add_metric([*base, "total"], total)
        busy = [r for r in gpus if r.utilization_ratio is not None]
        for r in busy:
            percent = (r.utilization_ratio or 0.0) * 100
            util.add_metric([*base, _gpu_manager_gpu(r.gpu, gpu_index)], percent)
        if busy:
            total = sum((r.utilization_ratio or 0.0) * 100 for r in busy)
            util.add_metric([*base, "total"], total)
        request_util.add_metric([*base, "total"], sum(r.reserved_compute_ratio for r in gpus))
        request_memory.add_metric([*base, "total"], sum(r.memory_limit_bytes for r in gpus) / _MIB)
    yield from (util, memory, request_util, request_memory)


def _gpu_manager_gpu(uuid: str, gpu_index: dict[str, int]) -> str:
    """gpu-manager names a GPU gpu<index>; a GPU this node does not list keeps its UUID."""
    index = gpu_index.get(uuid)
    return uuid if index is None else f"gpu{index}"


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


class ContextOverheadCollector(Collector):
    """What each CUDA context counts against its slice, and how that figure came about."""

    def __init__(self, overhead_bytes: int, source: str, node_name: str) -> None:
        self._bytes = overhead_bytes
        self._source = source  # configured, measured or unmeasured
        self._node = node_name

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "fracgpu_context_overhead_bytes",
            "GPU memory each CUDA context of a container counts against its slice; source: "
            "configured (--context-overhead-bytes), measured at start-up, or unmeasured "
            "(auto, and no GPU could be measured: contexts are not counted)",
            labels=["node", "source"],
        )
        gauge.add_metric([self._node, self._source], self._bytes)
        yield gauge


def build_registry(collector: AgentCollector, *more: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    for extra in more:  # e.g. the slice audit (agent/slice_audit.py)
        registry.register(extra)
    return registry
