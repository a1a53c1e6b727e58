"""The dashboard and alert rules use only metrics that fracgpu's code exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chartfiles import FILES_DIR
from tests.chart.promql import metric_names

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = FILES_DIR / "dashboards" / "fracgpu.json"
RULES = FILES_DIR / "alerts" / "fracgpu.rules.yaml"
METRIC_SOURCES = (REPO / "webhook" / "metrics.py", REPO / "agent" / "metrics.py")
# Series Prometheus itself adds for every scrape target.
PROMETHEUS_SERIES = frozenset({"up"})

_DEFINITION = re.compile(
    r"\b(Counter|Gauge|Histogram|Summary|CounterMetricFamily|GaugeMetricFamily|"
    r"HistogramMetricFamily|SummaryMetricFamily)\(\s*\"([a-zA-Z_:][a-zA-Z0-9_:]*)\""
)
_SUFFIXES = {
    "Counter": ("_total",),
    "CounterMetricFamily": ("_total",),
    "Gauge": ("",),
    "GaugeMetricFamily": ("",),
    "Histogram": ("_bucket", "_sum", "_count"),
    "HistogramMetricFamily": ("_bucket", "_sum", "_count"),
    "Summary": ("", "_sum", "_count"),
    "SummaryMetricFamily": ("", "_sum", "_count"),
}


def exported_series(sources: tuple[Path, ...] = METRIC_SOURCES) -> set[str]:
    """Series names the code exposes, as prometheus_client names them on /metrics."""
    series = set()
    for path in sources:
        for kind, name in _DEFINITION.findall(path.read_text()):
            # prometheus_client appends _total to counters (and strips one already there).
            base = name.removesuffix("_total") if kind.startswith("Counter") else name
            series |= {base + suffix for suffix in _SUFFIXES[kind]}
    return series


def _dashboard_expressions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            # Panel targets (expr) and template variables (definition, or a string query).
            if isinstance(value, str) and (
                key in ("expr", "definition") or (key == "query" and node.get("type") == "query")
            ):
                yield value
            else:
                yield from _dashboard_expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from _dashboard_expressions(item)


def _rule_expressions() -> list[tuple[str, str]]:
    document = yaml.safe_load(RULES.read_text())
    return [
        (rule.get("alert") or rule.get("record"), rule["expr"])
        for group in document["groups"]
        for rule in group["rules"]
    ]


def test_code_exports_metrics() -> None:
    series = exported_series()
    # Both components must be found, or the check below would pass on an empty set.
    assert any(s.startswith("fracgpu_webhook_") for s in series)
    assert any(s.startswith("fracgpu_gpu_") for s in series)


def test_every_alert_uses_exported_metrics() -> None:
    known = exported_series() | PROMETHEUS_SERIES
    unknown = {
        alert: sorted(metric_names(expr) - known)
        for alert, expr in _rule_expressions()
        if metric_names(expr) - known
    }
    assert unknown == {}


def test_every_dashboard_query_uses_exported_metrics() -> None:
    known = exported_series() | PROMETHEUS_SERIES
    expressions = list(_dashboard_expressions(json.loads(DASHBOARD.read_text())))
    assert len(expressions) >= 20
    unknown = {e: sorted(metric_names(e) - known) for e in expressions if metric_names(e) - known}
    assert unknown == {}


def test_alerts_cover_the_required_conditions() -> None:
    expressions = dict(_rule_expressions())
    used = {name for expr in expressions.values() for name in metric_names(expr)}
    assert "up" in used  # webhook down
    assert "fracgpu_gpu_healthy" in used  # GPU unhealthy
    assert "fracgpu_container_memory_limit_bytes" in used  # containers at their slice
    for alert, expr in _rule_expressions():
        assert alert and expr.strip(), alert


def test_every_alert_is_in_the_operators_table() -> None:
    """docs/operations.md says what each alert means and where to look."""
    table = (REPO / "docs" / "operations.md").read_text()
    alerts = [alert for alert, _ in _rule_expressions() if alert]
    assert len(alerts) >= 10
    assert [a for a in alerts if f"`{a}`" not in table] == []


def test_rules_are_well_formed() -> None:
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
            assert rule["labels"]["severity"] in ("critical", "warning", "info")
            assert rule["annotations"]["summary"]
            if "for" in rule:
                assert re.fullmatch(r"\d+[smh]", rule["for"])


def test_dashboard_is_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for topic in ("allocat", "per gpu", "per container", "oom", "latency", "rejection"):
        assert topic in titles


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ('sum by (le) (rate(a_bucket{x="y"}[5m]))', {"a_bucket"}),
        ("b / (c > 0) > 0.95", {"b", "c"}),
        ('absent(up{job=~".*w.*"} == 1)', {"up"}),
        ('topk(20, d{namespace=~"$namespace"})', {"d"}),
        ("label_values(e, model)", {"e"}),
        ("increase(f_total[10m]) > 0 or vector(0)", {"f_total"}),
        ("rat(g[5m])", {"rat", "g"}),  # a misspelt function is reported, not skipped
    ],
)
def test_metric_name_extraction(expression: str, names: set[str]) -> None:
    assert metric_names(expression) == names


def test_exported_series_follow_prometheus_client_naming(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        'Counter("x_events", "h")\nHistogram("x_seconds", "h")\n'
        'GaugeMetricFamily("x_level", "h")\nCounterMetricFamily("x_done_total", "h")\n'
    )
    assert exported_series((source,)) == {
        "x_events_total",
        "x_seconds_bucket",
        "x_seconds_sum",
        "x_seconds_count",
        "x_level",
        "x_done_total",
    }


def _table_value_columns(panel: dict[str, Any]) -> list[str]:
    """The value columns Grafana gives a table panel: "Value" for one query, "Value #<refId>"
    for each of several (what an operator sees unless the panel renames them)."""
    targets = panel["targets"]
    if len(targets) == 1:
        return ["Value"]
    return [f"Value #{target['refId']}" for target in targets]


def test_table_columns_are_titled() -> None:
    tables = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] == "table"]
    assert len(tables) >= 3
    for panel in tables:
        # Table-format instant queries: one row per series, labels as columns.
        assert all(t.get("format") == "table" and t.get("instant") for t in panel["targets"])
        organize = [t for t in panel.get("transformations", []) if t["id"] == "organize"]
        assert organize, f"{panel['title']}: no organize transformation names its columns"
        renamed = organize[-1]["options"]["renameByName"]
        for column in _table_value_columns(panel):
            title = renamed.get(column, "")
            assert title and not title.startswith("Value"), (panel["title"], column)
        # The label columns that stay visible get a title too.
        hidden = organize[-1]["options"].get("excludeByName", {})
        assert hidden.get("Time"), panel["title"]
        for label, title in renamed.items():
            assert title and title[0].isupper(), (panel["title"], label)


def test_no_expression_depends_on_a_scrape_job_name() -> None:
    expressions = [expr for _, expr in _rule_expressions()]
    expressions += list(_dashboard_expressions(json.loads(DASHBOARD.read_text())))
    tied = [e for e in expressions if re.search(r"\bjob\s*(=~|!~|=|!=)", e)]
    assert tied == []


def test_quota_metrics_are_on_the_dashboard() -> None:
    expressions = list(_dashboard_expressions(json.loads(DASHBOARD.read_text())))
    used = {name for e in expressions for name in metric_names(e)}
    assert {"fracgpu_quota_used", "fracgpu_quota_hard"} <= used
