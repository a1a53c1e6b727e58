"""The alert rules, run by promtool against series the real exporters produce.

The webhook (HTTPS, its embedded state) and the agent (its collector behind
prometheus_client's HTTP server, the NVML double underneath, as `fracgpu-agent` serves it)
are scraped here; their exposition text becomes promtool's input series, with the target
labels a Prometheus adds (job names that contain neither "fracgpu" nor "webhook"/"agent",
so no rule can lean on them). Each scenario says which alerts must fire and which must not;
on a healthy install none may fire, however long it runs.

promtool is Debian's `prometheus` package (scripts/install-system-deps.sh); without it the
test is skipped here and fails in CI.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from agent.containers import LiveContainer
from agent.discovery import discover
from agent.metrics import AgentCollector, ContextOverheadCollector, build_registry
from agent.nvml_backend import PynvmlBackend
from fracgpu.shim_abi import DeviceLimits, Limits
from tests.agent.nvml_double import (
    NvmlDouble,
    double_in_this_process,
)
from tests.chart.test_monitoring import RULES
from tests.webhook.support import cluster_state, gpu_pod, plain_pod, start_webhook, stop_webhook

GIB = 1 << 30
UUID0 = "GPU-0a0a0a0a-1111-4222-8333-444444444400"
UUID1 = "GPU-0a0a0a0a-1111-4222-8333-444444444401"
# Scrape targets as a Prometheus with the usual pod discovery names them.
WEBHOOK_TARGETS = (
    {"job": "kubernetes-pods", "instance": "10.4.0.11:8443"},
    {"job": "kubernetes-pods", "instance": "10.4.0.12:8443"},
)
AGENT_TARGET = {"job": "node-exporters", "instance": "10.4.1.7:9400"}
MINUTES = 6 * 60  # every scenario runs six hours at a 1 m scrape interval


@dataclass(frozen=True)
class Series:
    name: str
    labels: dict[str, str]
    value: float

    def selector(self, target: dict[str, str]) -> str:
        labels = {**self.labels, **target}
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        return f"{self.name}{{{inner}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse(text: str) -> list[Series]:
    return [
        Series(sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    ]


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool not installed: apt-get install prometheus (install-system-deps.sh)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


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
        device__0__utilization_gpu=40,
        device__1__uuid=UUID1,
        device__1__name="NVIDIA A10",
        device__1__memory_bytes=24 * GIB,
    )


@pytest.fixture
def backend(double: NvmlDouble) -> Iterator[PynvmlBackend]:
    nvml = PynvmlBackend()
    yield nvml
    nvml.shutdown()


def _scrape_agent(
    backend: PynvmlBackend, health: dict[str, bool], context_source: str = "measured"
) -> str:
    """GET /metrics from the agent's HTTP exporter, as Prometheus would."""
    found = discover(backend)
    limits = Limits((DeviceLimits(UUID0, 4 * GIB, 30),), namespace="team-a", pod="train")
    containers = [LiveContainer("team-a", "train", "main", ("k1",), limits, None)]
    collector = AgentCollector(
        backend,
        lambda: found.devices,
        lambda: health,
        lambda: containers,
        node_name="gpu-node-1",
    )
    overhead = 0 if context_source == "unmeasured" else 300 << 20
    contexts = ContextOverheadCollector(overhead, context_source, "gpu-node-1")
    registry = build_registry(collector, contexts)
    server, thread = start_http_server(0, "127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


async def _scrape_webhook(directory: Path) -> str:
    """GET /metrics from a real webhook (HTTPS) after it answered some admissions."""
    webhook = await start_webhook(directory, cluster_state())
    try:
        ask = {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"}
        await webhook.admit(gpu_pod(ask))
        await webhook.admit(plain_pod())
        await webhook.admit(gpu_pod({"tencent.com/vcuda-core": "60"}, namespace="limited"))
        status, text = await webhook.client.get("/metrics")
    finally:
        await stop_webhook(webhook)
    assert status == 200
    return text


def _values(value: float, up_minutes: int | None = None) -> str:
    """promtool's expanding notation: constant ``value`` for the whole run, or for
    ``up_minutes`` and then stale (a failed scrape marks a target's series stale)."""
    if up_minutes is None:
        return f"{value:g}+0x{MINUTES}"
    return f"{value:g}+0x{up_minutes} stale"


def _target_series(
    series: list[Series], target: dict[str, str], down_after: int | None
) -> list[dict[str, str]]:
    found = [{"series": s.selector(target), "values": _values(s.value, down_after)} for s in series]
    up = "1+0x" + str(MINUTES) if down_after is None else f"1+0x{down_after} 0+0x{MINUTES}"
    found.append({"series": Series("up", {}, 1).selector(target), "values": up})
    return found


def _alert_names() -> list[str]:
    document = yaml.safe_load(RULES.read_text())
    return [rule["alert"] for group in document["groups"] for rule in group["rules"]]


def _rules_without_annotations(directory: Path) -> Path:
    """The shipped rules as they are, less their annotations: promtool compares expected
    annotations verbatim, and they are prose (checked by `promtool check rules`)."""
    document: dict[str, Any] = copy.deepcopy(yaml.safe_load(RULES.read_text()))
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _run_promtool(promtool: str, directory: Path, tests: list[dict[str, Any]]) -> None:
    rules = _rules_without_annotations(directory)
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    document = {"rule_files": [rules.name], "evaluation_interval": "1m", "tests": tests}
    test_file = directory / "tests.yaml"
    test_file.write_text(yaml.safe_dump(document, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", test_file.name],
        cwd=directory,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _none_fire(eval_time: str, *, but: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [
        {"eval_time": eval_time, "alertname": name, "exp_alerts": but.get(name, [])}
        for name in _alert_names()
    ]


async def test_alerts_on_series_the_exporters_produce(
    backend: PynvmlBackend, promtool: str, tmp_path: Path
) -> None:
    webhook = parse(await _scrape_webhook(tmp_path / "tls"))
    agent = parse(_scrape_agent(backend, {UUID0: True, UUID1: True}))
    sick_agent = parse(_scrape_agent(backend, {UUID0: True, UUID1: False}))
    blind_agent = parse(_scrape_agent(backend, {UUID0: True, UUID1: True}, "unmeasured"))
    # The series the rules key on are really there (else the scenarios prove nothing).
    names = {s.name for s in webhook + agent}
    assert {"fracgpu_webhook_placing", "fracgpu_agent_scrape_errors"} <= names
    assert {"fracgpu_gpu_healthy", "fracgpu_container_memory_limit_bytes"} <= names
    assert all(
        s.labels.get("node") == "gpu-node-1" for s in agent if s.name == "fracgpu_gpu_healthy"
    )

    def cluster(
        webhook_down: tuple[int | None, int | None] = (None, None),
        agent_down: int | None = None,
        agent_series: list[Series] = agent,
    ) -> list[dict[str, str]]:
        series = []
        for target, down in zip(WEBHOOK_TARGETS, webhook_down, strict=True):
            series += _target_series(webhook, target, down)
        return series + _target_series(agent_series, AGENT_TARGET, agent_down)

    agent_labels = {**AGENT_TARGET, "severity": "warning"}
    unhealthy = next(
        s.labels for s in sick_agent if s.name == "fracgpu_gpu_healthy" and s.value == 0
    )
    tests = [
        {  # healthy for six hours: nothing fires, ever
            "interval": "1m",
            "input_series": cluster(),
            "alert_rule_test": [
                *_none_fire("30m", but={}),
                *_none_fire("5h", but={}),
            ],
        },
        {  # one webhook replica down from minute 60: a warning, admission still works
            "interval": "1m",
            "input_series": cluster(webhook_down=(60, None)),
            "alert_rule_test": _none_fire(
                "90m", but={"FracgpuWebhookReplicaDown": [{"exp_labels": {"severity": "warning"}}]}
            ),
        },
        {  # both replicas down: critical
            "interval": "1m",
            "input_series": cluster(webhook_down=(60, 60)),
            "alert_rule_test": _none_fire(
                "90m",
                but={
                    "FracgpuWebhookDown": [{"exp_labels": {"severity": "critical"}}],
                    "FracgpuWebhookReplicaDown": [{"exp_labels": {"severity": "warning"}}],
                },
            ),
        },
        {  # the agent's target fails its scrapes
            "interval": "1m",
            "input_series": cluster(agent_down=60),
            "alert_rule_test": _none_fire(
                "90m", but={"FracgpuAgentDown": [{"exp_labels": agent_labels}]}
            ),
        },
        {  # the agent measured no CUDA context at start-up: contexts escape the slices
            "interval": "1m",
            "input_series": cluster(agent_series=blind_agent),
            "alert_rule_test": _none_fire(
                "30m",
                but={
                    "FracgpuContextsNotCounted": [
                        {
                            "exp_labels": {
                                **agent_labels,
                                "node": "gpu-node-1",
                                "source": "unmeasured",
                            }
                        }
                    ]
                },
            ),
        },
        {  # the agent reports a GPU unhealthy: the alert names the GPU and its node
            "interval": "1m",
            "input_series": cluster(agent_series=sick_agent),
            "alert_rule_test": _none_fire(
                "30m",
                but={
                    "FracgpuGPUUnhealthy": [
                        {"exp_labels": {**unhealthy, **AGENT_TARGET, "severity": "critical"}}
                    ]
                },
            ),
        },
    ]
    _run_promtool(promtool, tmp_path, tests)
