"""Prometheus metrics of one webhook app, in its own registry (never the global one)."""

from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
# Admission must answer well inside the API server's 10 s default timeout.
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._admissions = Counter(
            "fracgpu_webhook_admissions",
            "Admission answers by endpoint and verdict (allowed, patched, denied, errored, "
            "malformed, forwarded to the leader)",
            ["endpoint", "verdict"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "fracgpu_webhook_admission_duration_seconds",
            "Time from receiving a review to answering it",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._placement_failures = Counter(
            "fracgpu_webhook_placement_failures",
            "Pods that could not be placed, by reason (never, not-now, quota, conflict)",
            ["reason"],
            registry=self.registry,
        )
        # Labelled children by label values: ``labels()`` costs a lock and argument checks on
        # every admission; the few combinations are looked up once.
        self._children: dict[tuple[str, ...], tuple[Counter, Histogram]] = {}

    def admission(self, endpoint: str, verdict: str, seconds: float) -> None:
        children = self._children.get((endpoint, verdict))
        if children is None:
            children = self._children[(endpoint, verdict)] = (
                self._admissions.labels(endpoint, verdict),
                self._latency.labels(endpoint),
            )
        children[0].inc()
        children[1].observe(seconds)

    def watch_placing(self, placing: Callable[[], bool]) -> None:
        """Export whether this replica places GPU pods now (read at every scrape)."""
        gauge = Gauge(
            "fracgpu_webhook_placing",
            "1 while this replica places GPU pods (the leader, past its takeover wait), else 0",
            registry=self.registry,
        )
        gauge.set_function(lambda: float(placing()))

    def placement_failure(self, reason: str) -> None:
        self._placement_failures.labels(reason=reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
