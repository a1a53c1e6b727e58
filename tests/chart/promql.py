"""Metric names used in PromQL expressions (alert rules, Grafana panels), for tests.

Not a PromQL parser: it removes what cannot be a metric name (strings, label matchers,
grouping clauses, ranges, numbers, Grafana variables) and returns the identifiers left that
are not PromQL functions, aggregations or keywords. Anything unexpected therefore shows up
as a "metric" and fails the check against the exported names, rather than passing unseen.
"""

from __future__ import annotations

import re
from typing import Final

FUNCTIONS: Final = frozenset(
    [
        "abs",
        "absent",
        "absent_over_time",
        "avg_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "count_over_time",
        "delta",
        "deriv",
        "exp",
        "floor",
        "histogram_quantile",
        "idelta",
        "increase",
        "irate",
        "label_join",
        "label_replace",
        "last_over_time",
        "ln",
        "log2",
        "log10",
        "max_over_time",
        "min_over_time",
        "predict_linear",
        "quantile_over_time",
        "rate",
        "resets",
        "round",
        "scalar",
        "sort",
        "sort_desc",
        "sqrt",
        "stddev_over_time",
        "sum_over_time",
        "time",
        "timestamp",
        "vector",
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        # Grafana template queries
        "label_values",
    ]
)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_NUMBER = re.compile(r"(?<![\w.])\d+(\.\d+)?([eE][-+]?\d+)?")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expression: str) -> set[str]:
    text = _STRING.sub(" ", expression)
    text = _VARIABLE.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    label_values = re.findall(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)", expression)
    text = re.sub(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)", " ", text)
    names = {name for name in _IDENTIFIER.findall(text) if name not in FUNCTIONS}
    return names | set(label_values)
