"""Prometheus metrics of one webhook app, in its own registry (never the global one)."""

import bisect
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from fracgpu.model import Quota, ResourceAmounts, ResourceLimits
from webhook.state.backend import DriftCounts

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
# Admission must answer well inside the API server's 10 s default timeout.
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._admissions = AdmissionStats()
        self.registry.register(self._admissions)
        self._placement_failures = Counter(
            "fracgpu_webhook_placement_failures",
            "Pods that could not be placed, by reason (never, not-now, quota, conflict)",
            ["reason"],
            registry=self.registry,
        )

    def admission(self, endpoint: str, verdict: str, seconds: float) -> None:
        self._admissions.record(endpoint, verdict, seconds)

    def watch_placing(self, placing: Callable[[], bool]) -> None:
        """Export whether this replica places GPU pods now (read at every scrape)."""
        gauge = Gauge(
            "fracgpu_webhook_placing",
            "1 while this replica places GPU pods (the leader, past its takeover wait), else 0",
            registry=self.registry,
        )
        gauge.set_function(lambda: float(placing()))

    def watch_queue(self, waiting: Callable[[], int]) -> None:
        """Export how many GPU pods wait in fracgpu's queue (queue mode; read at scrape)."""
        gauge = Gauge(
            "fracgpu_webhook_queue_waiting",
            "GPU pods created queued and not placed yet (queue mode), as this replica's pod "
            "cache shows them",
            registry=self.registry,
        )
        gauge.set_function(lambda: float(waiting()))

    def watch_quotas(self, quotas: Callable[[], Iterable[Quota]]) -> None:
        """Export every GPUQuota's hard limits and use (read at every scrape)."""
        self.registry.register(QuotaStats(quotas))

    def watch_drift(self, counts: Callable[[], DriftCounts]) -> None:
        """Export what the state's self-check found (read at every scrape)."""
        self.registry.register(DriftStats(counts))

    def placement_failure(self, reason: str) -> None:
        self._placement_failures.labels(reason=reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class AdmissionStats(Collector):
    """Admission answers by (endpoint, verdict) and their latency by endpoint, counted in
    plain numbers and turned into samples only when scraped: a labelled prometheus_client
    counter and histogram cost a lock and several calls on every admission. Admissions and
    scrapes both run on the event loop, so a scrape reads a consistent count."""

    def __init__(self) -> None:
        self._answers: dict[tuple[str, str], int] = {}
        self._latency: dict[str, _Latency] = {}  # by endpoint

    def record(self, endpoint: str, verdict: str, seconds: float) -> None:
        key = (endpoint, verdict)
        self._answers[key] = self._answers.get(key, 0) + 1
        latency = self._latency.get(endpoint)
        if latency is None:
            latency = self._latency[endpoint] = _Latency()
        # A bucket counts observations up to and including its bound (Prometheus' "le").
        latency.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        latency.total += seconds

    def collect(self) -> Iterator[Metric]:
        answers = CounterMetricFamily(
            "fracgpu_webhook_admissions",
            "Admission answers by endpoint and verdict (allowed, patched, denied, errored, "
            "malformed, forwarded to the leader)",
            labels=["endpoint", "verdict"],
        )
        for (endpoint, verdict), count in self._answers.items():
            answers.add_metric([endpoint, verdict], count)
        yield answers
        latency = HistogramMetricFamily(
            "fracgpu_webhook_admission_duration_seconds",
            "Time from receiving a review to answering it",
            labels=["endpoint"],
        )
        bounds = [*map(floatToGoString, LATENCY_BUCKETS), "+Inf"]
        for endpoint, observed in self._latency.items():
            buckets = list(zip(bounds, accumulate(observed.counts), strict=True))
            latency.add_metric([endpoint], buckets, observed.total)
        yield latency


class _Latency:
    """One endpoint's observations: a count per bucket (the last above every bound) and
    their sum in seconds."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0


# Quota dimensions as the GPUQuota object names them (spec.hard / status.used keys), with
# the model fields they are read from.
QUOTA_RESOURCES: Final = (("cores", "cores"), ("memoryMiB", "memory_mib"), ("gpus", "gpus"))
_QUOTA_LABELS: Final = ("namespace", "quota", "resource", "model")


class QuotaStats(Collector):
    """GPUQuota limits and use by namespace, quota, resource and model ("" = the whole
    namespace, else a key of spec.models). A limit that is not set (unlimited) has no
    ``hard`` series; ``used`` is always there. Every replica exports what its watch cache
    holds, so aggregate with max by (namespace, quota, resource, model)."""

    def __init__(self, quotas: Callable[[], Iterable[Quota]]) -> None:
        self._quotas = quotas

    def collect(self) -> Iterator[Metric]:
        hard = GaugeMetricFamily(
            "fracgpu_quota_hard",
            "GPUQuota limit (spec.hard, or spec.models per model): cores in vcuda-core "
            "(100 = one GPU), memoryMiB in MiB, gpus in whole GPUs",
            labels=_QUOTA_LABELS,
        )
        used = GaugeMetricFamily(
            "fracgpu_quota_used",
            "GPUQuota use (status.used, or status.usedByModel per model), in the units of "
            "fracgpu_quota_hard",
            labels=_QUOTA_LABELS,
        )
        for quota in self._quotas():
            scopes: list[tuple[str, ResourceLimits | None, ResourceAmounts]] = [
                ("", quota.hard, quota.used)
            ]
            for model in sorted(quota.hard_by_model.keys() | quota.used_by_model.keys()):
                scopes.append(
                    (
                        model,
                        quota.hard_by_model.get(model),
                        quota.used_by_model.get(model, ResourceAmounts()),
                    )
                )
            for model, limits, amounts in scopes:
                for resource, attribute in QUOTA_RESOURCES:
                    labels = [quota.namespace, quota.name, resource, model]
                    limit = None if limits is None else getattr(limits, attribute)
                    if limit is not None:
                        hard.add_metric(labels, float(limit))
                    used.add_metric(labels, float(getattr(amounts, attribute)))
        yield hard
        yield used


class DriftStats(Collector):
    """The leader's self-check of its bookkeeping: checks run, and drift by kind (pod, claim,
    window, node, gpu, node-use), repaired and found by the last check. Only the leader
    checks: followers export zeros."""

    def __init__(self, counts: Callable[[], DriftCounts]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = self._counts()
        checks = CounterMetricFamily(
            "fracgpu_webhook_state_self_checks",
            "Self-checks of the leader's bookkeeping against a recount from the watch caches",
        )
        checks.add_metric([], counts.checks)
        yield checks
        repairs = CounterMetricFamily(
            "fracgpu_webhook_state_drift_repairs",
            "Differences between the leader's bookkeeping and a recount, repaired (recount "
            "wins), by kind",
            labels=["kind"],
        )
        for kind, count in sorted(counts.repairs.items()):
            repairs.add_metric([kind], count)
        yield repairs
        drifted = GaugeMetricFamily(
            "fracgpu_webhook_state_drifted_items",
            "Differences the last self-check found (and repaired), by kind",
            labels=["kind"],
        )
        for kind, count in sorted(counts.drifted.items()):
            drifted.add_metric([kind], count)
        yield drifted
