"""/metrics: admissions by verdict, latency, placement failures by reason; one registry per app."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from tests.webhook.conftest import StartWebhook
from tests.webhook.support import Webhook, gpu_pod, plain_pod
from webhook.cli.client import build_review
from webhook.metrics import LATENCY_BUCKETS, Metrics

Labels = tuple[tuple[str, str], ...]


def sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if match is None or match[1] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match[2] or ""))
        if found == labels:
            return float(match[3])
    return 0.0


async def test_metrics_count_verdicts_latency_and_placement_failures(webhook: Webhook) -> None:
    await webhook.admit(gpu_pod({"tencent.com/vcuda-core": "30"}))  # patched + allowed
    await webhook.admit(gpu_pod({"tencent.com/vcuda-core": "150"}))  # denied (invalid)
    await webhook.admit(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "99999"}))  # never
    await webhook.admit(gpu_pod({"tencent.com/vcuda-core": "60"}, namespace="limited"))  # quota
    await webhook.client.review("/validate", build_review(plain_pod()))
    await webhook.client.post_raw("/mutate", b"nope")
    status, text = await webhook.client.get("/metrics")
    assert status == 200
    count = "fracgpu_webhook_admissions_total"
    assert sample(text, count, endpoint="mutate", verdict="patched") == 1
    assert sample(text, count, endpoint="mutate", verdict="denied") == 3
    assert sample(text, count, endpoint="mutate", verdict="malformed") == 1
    assert sample(text, count, endpoint="validate", verdict="allowed") == 2
    failures = "fracgpu_webhook_placement_failures_total"
    assert sample(text, failures, reason="never") == 1
    assert sample(text, failures, reason="quota") == 1
    latency = "fracgpu_webhook_admission_duration_seconds_count"
    assert sample(text, latency, endpoint="mutate") == 5
    assert (
        sample(
            text, "fracgpu_webhook_admission_duration_seconds_bucket", endpoint="mutate", le="+Inf"
        )
        == 5
    )


async def test_each_app_has_its_own_registry(start: StartWebhook) -> None:
    first, second = await start(), await start()
    await first.admit(plain_pod())
    _, text = await second.client.get("/metrics")
    assert (
        sample(text, "fracgpu_webhook_admissions_total", endpoint="mutate", verdict="patched") == 0
    )
    assert REGISTRY.get_sample_value("fracgpu_webhook_admissions_total") is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["mutate", "validate"]),
            st.sampled_from(["allowed", "patched", "denied"]),
            st.one_of(st.sampled_from(LATENCY_BUCKETS), st.floats(0, 20)),
        ),
        max_size=40,
    )
)
def test_admission_samples_equal_prometheus_clients_own(
    answers: list[tuple[str, str, float]],
) -> None:
    """The plain counts give the samples a labelled Counter and Histogram would (their
    optional ``_created`` series aside), bucket bounds included."""
    ours = Metrics()
    registry = CollectorRegistry()
    counter = Counter("fracgpu_webhook_admissions", "x", ["endpoint", "verdict"], registry=registry)
    histogram = Histogram(
        "fracgpu_webhook_admission_duration_seconds",
        "x",
        ["endpoint"],
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    for endpoint, verdict, seconds in answers:
        ours.admission(endpoint, verdict, seconds)
        counter.labels(endpoint, verdict).inc()
        histogram.labels(endpoint).observe(seconds)

    def samples(
        registry: CollectorRegistry,
    ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in registry.collect()
            if family.name.startswith("fracgpu_webhook_admission")
            for s in family.samples
            if not s.name.endswith("_created")
        }

    expected = samples(registry)
    got = samples(ours.registry)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key


async def test_quota_limits_and_use_by_namespace_and_resource(webhook: Webhook) -> None:
    # An admission charges the "limited" quota: its use shows at the next scrape.
    ask = {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"}  # 2 GiB
    response = await webhook.admit(gpu_pod(ask, namespace="limited"))
    assert response.allowed, response.message
    _, text = await webhook.client.get("/metrics")
    small = {"namespace": "limited", "quota": "small", "model": ""}
    assert sample(text, "fracgpu_quota_hard", resource="cores", **small) == 50
    assert sample(text, "fracgpu_quota_hard", resource="memoryMiB", **small) == 8192
    assert sample(text, "fracgpu_quota_hard", resource="gpus", **small) == 0
    assert sample(text, "fracgpu_quota_used", resource="cores", **small) == 30
    assert sample(text, "fracgpu_quota_used", resource="memoryMiB", **small) == 2048
    assert sample(text, "fracgpu_quota_used", resource="gpus", **small) == 0
    # An unset limit (unlimited) has no hard series; its use is still exported.
    whole = {"namespace": "wholes", "quota": "whole-gpus", "model": ""}
    assert _has(text, "fracgpu_quota_hard", resource="gpus", **whole)
    assert not _has(text, "fracgpu_quota_hard", resource="cores", **whole)
    assert _has(text, "fracgpu_quota_used", resource="cores", **whole)
    # Per-model limits carry the model key.
    per_model = {"namespace": "models", "quota": "per-model", "model": "A100"}
    assert sample(text, "fracgpu_quota_hard", resource="cores", **per_model) == 20
    assert _has(text, "fracgpu_quota_used", resource="cores", **per_model)


def _has(text: str, name: str, **labels: str) -> bool:
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        found = dict(re.findall(r'(\w+)="([^"]*)"', match[2] or "")) if match else None
        if match and match[1] == name and found == labels:
            return True
    return False
