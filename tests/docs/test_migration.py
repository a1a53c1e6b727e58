"""docs/migration.md's mapping tables stay true: every fracgpu name they cite (flag,
environment variable, chart value, resource, annotation, CRD field, metric) exists in the
code, every row either names a fracgpu equivalent or says why there is none, every
user-facing fracgpu knob of the dialects is mapped, and every source system's knob is
listed."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import settings as agent_settings
from fracgpu import names
from tests.chart import crdschema
from tests.chart.chartfiles import CHART_DIR
from tests.chart.test_monitoring import exported_series
from webhook import settings as webhook_settings
from webhook.kubectl import plugin as kubectl_plugin

DOC = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
SOURCES = ("From TKEStack gpu-manager", "From HAMi", "From Alibaba gpushare")
# A row without a fracgpu name must say why there is none.
NO_EQUIVALENT = ("not supported", "not needed", "not read", "not set", "not exported")
# Tokens that name something in fracgpu, by shape.
FLAG = re.compile(r"^--[a-z0-9-]+$")
ENV = re.compile(r"^FRACGPU_[A-Z0-9_]+$")
CHART_VALUE = re.compile(r"^(?:webhook|webhooks|agent|resourceNames)\.[A-Za-z0-9.]+$")
CRD_FIELD = re.compile(r"^(GPUNode|GPUQuota)\.((?:spec|status)(?:\.[A-Za-z]+)*)$")
QUALIFIED = re.compile(r"^(?:requests\.|limits\.)?([a-z0-9.-]+\.(?:io|com)/[a-z0-9.-]+)$")
METRIC = re.compile(r"\b(fracgpu_[a-z_]+|container_(?:gpu|request_gpu)_[a-z_]+)\b")
KUBECTL = re.compile(r"^kubectl fracgpu ([a-z]+)")

# The knobs each source system has (names from its code and chart; see the doc's sources).
SOURCE_KNOBS = {
    "From TKEStack gpu-manager": (
        "tencent.com/vcuda-core",
        "tencent.com/vcuda-memory",
        "tencent.com/vcuda-core-limit",
        "tencent.com/predicate-gpu-idx-",
        "nvidia-device-enable",
        "tkestack.io/gpu-model",
        "tkestack.io/gpu-pool",
        "gpuquota",
        "quota:",
        "pool:",
        *(
            f"--{flag}"
            for flag in [
                "share-mode",
                "hostname-override",
                "kubeconfig",
                "device-plugin-path",
                "virtual-manager-path",
                "checkpoint-path",
                "query-port",
                "query-addr",
                "sample-period",
                "allocation-check-period",
                "container-runtime-endpoint",
                "cgroup-driver",
                "runtime-request-timeout",
                "volume-config",
                "extra-config",
                "driver",
                "node-labels",
                "wait-timeout",
            ]
        ),
        "container_gpu_utilization",
        "container_gpu_memory_total",
        "container_request_gpu_utilization",
        "container_request_gpu_memory",
    ),
    "From HAMi": (
        *[
            "resourceName",
            "resourceMem",
            "resourceMemPercentage",
            "resourceCores",
            "resourcePriority",
        ],
        "nvidia.com/use-gputype",
        "nvidia.com/nouse-gputype",
        "nvidia.com/use-gpuuuid",
        "nvidia.com/nouse-gpuuuid",
        "hami.io/node-scheduler-policy",
        "hami.io/gpu-scheduler-policy",
        "hami.io/webhook",
        *[
            "deviceSplitCount",
            "deviceMemoryScaling",
            "deviceCoreScaling",
            "disablecorelimit",
            "migStrategy",
            "defaultMem",
            "defaultCores",
            "defaultGPUNum",
            "filterdevices",
            "operatingmode",
            "schedulerName",
            "whitelistNamespaces",
            "nvidiaNodeSelector",
            "gpuCorePolicy",
            "libCudaLogLevel",
            "preConfiguredDeviceMemory",
            "enableNumaTopology",
            "runtimeClassName",
        ],
        *[
            "CUDA_DEVICE_MEMORY_LIMIT",
            "CUDA_DEVICE_SM_LIMIT",
            "GPU_CORE_UTILIZATION_POLICY",
            "CUDA_DISABLE_CONTROL",
            "ACTIVE_OOM_KILLER",
            "CUDA_TASK_PRIORITY",
            "LIBCUDA_LOG_LEVEL",
        ],
        *[
            "HostGPUMemoryUsage",
            "HostCoreUtilization",
            "vGPU_device_memory_usage_in_bytes",
            "vGPU_device_memory_limit_in_bytes",
            "Device_utilization_desc_of_container",
            "Device_memory_desc_of_container",
            "GPUDeviceCoreAllocated",
            "GPUDeviceMemoryAllocated",
            "GPUDeviceSharedNum",
            "GPUDeviceMemoryLimit",
            "GPUDeviceCoreLimit",
            "vGPUCoreAllocated",
            "vGPUMemoryAllocated",
            "QuotaUsed",
        ],
    ),
    "From Alibaba gpushare": (
        "aliyun.com/gpu-mem",
        "aliyun.com/gpu-count",
        "--memory-unit",
        *(
            f"ALIYUN_COM_GPU_MEM_{suffix}"
            for suffix in ["IDX", "POD", "CONTAINER", "DEV", "ASSIGNED", "ASSUME_TIME"]
        ),
        "--mps",
        "--health-check",
        "--query-kubelet",
        "gpushare=true",
    ),
}


@dataclass(frozen=True)
class Row:
    section: str
    source: str
    fracgpu: str

    def names(self) -> list[str]:
        return re.findall(r"`([^`]+)`", self.fracgpu)


def mapping_rows(text: str) -> Iterator[Row]:
    """Rows of the two-column tables under each '## From ...' heading."""
    section = ""
    header_seen = False
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            header_seen = False
        if not line.startswith("|"):
            header_seen = False
            continue
        cells = [cell.strip() for cell in _split_row(line)]
        if set("".join(cells)) <= set("-: "):
            continue
        if not header_seen:
            header_seen = True
            assert len(cells) == 2 and cells[1].startswith("fracgpu"), line
            continue
        if section in SOURCES:
            yield Row(section, cells[0], cells[1])


def _split_row(line: str) -> list[str]:
    """Table cells; a | inside backticks belongs to the cell."""
    cells, current, quoted = [], "", False
    for char in line.strip().strip("|"):
        if char == "`":
            quoted = not quoted
        if char == "|" and not quoted:
            cells.append(current)
            current = ""
        else:
            current += char
    cells.append(current)
    return cells


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    found = list(mapping_rows(DOC.read_text()))
    assert {row.section for row in found} == set(SOURCES)
    return found


def _agent_flags() -> set[str]:
    parser = agent_settings._parser()
    return {flag for action in parser._actions for flag in action.option_strings}


def _chart_paths() -> set[str]:
    paths: set[str] = set()

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                paths.add(prefix + key)
                walk(value, f"{prefix}{key}.")

    for profile in ("values.yaml", "values-hami.yaml"):
        walk(yaml.safe_load((CHART_DIR / profile).read_text()), "")
    return paths


def _crd_fields() -> set[str]:
    fields: set[str] = set()

    def walk(schema: Mapping[str, Any], prefix: str) -> None:
        for key, sub in schema.get("properties", {}).items():
            fields.add(prefix + key)
            walk(sub, f"{prefix}{key}.")
        if isinstance(schema.get("items"), Mapping):
            walk(schema["items"], prefix)

    for kind, schema in crdschema.schemas().items():
        walk(schema, f"{kind}.")
    return fields


def _qualified_names() -> set[str]:
    """Resource, annotation and label names fracgpu reads or writes, and the profiles' names."""
    constants = {v for v in vars(names).values() if isinstance(v, str) and "/" in v}
    profiles = set()
    for profile in ("values.yaml", "values-hami.yaml"):
        profiles |= set(yaml.safe_load((CHART_DIR / profile).read_text())["resourceNames"].values())
    return constants | profiles


def test_every_cited_fracgpu_name_exists(rows: list[Row]) -> None:
    flags = {o.flag for o in webhook_settings.OPTIONS} | _agent_flags()
    agent_envs = {
        agent_settings.ENV_PREFIX + f.removeprefix("--").replace("-", "_").upper()
        for f in _agent_flags()
    }
    envs = {o.env for o in webhook_settings.OPTIONS} | agent_envs | names.USER_SHIM_VARIABLES
    chart, crd, qualified = _chart_paths(), _crd_fields(), _qualified_names()
    metrics = exported_series()
    checked = dict.fromkeys(("flag", "env", "chart", "crd", "name", "metric", "kubectl"), 0)
    missing = []
    for row in rows:
        for token in row.names():
            kind, known = _classify(token, flags, envs, chart, crd, qualified, metrics)
            if kind is None:
                continue
            checked[kind] += 1
            if not known:
                missing.append(f"{row.section}: {token} ({kind})")
    assert missing == [], f"cited in docs/migration.md, missing in fracgpu: {missing}"
    assert all(count >= 2 for count in checked.values()), checked


def _classify(
    token: str,
    flags: set[str],
    envs: frozenset[str] | set[str],
    chart: set[str],
    crd: set[str],
    qualified: set[str],
    metrics: set[str],
) -> tuple[str | None, bool]:
    """(kind of fracgpu name, whether it exists), or (None, True) for other text."""
    if FLAG.match(token):
        return "flag", token in flags
    if ENV.match(token):
        return "env", token in envs
    if CHART_VALUE.match(token):
        return "chart", token in chart
    crd_field = CRD_FIELD.match(token)
    if crd_field:
        return "crd", f"{crd_field[1]}.{crd_field[2]}" in crd
    qualified_name = QUALIFIED.match(_head(token))
    if qualified_name:
        return "name", qualified_name[1] in qualified
    found = METRIC.findall(token)
    if found:
        return "metric", all(m in metrics for m in found)
    command = KUBECTL.match(token)
    if command:
        return "kubectl", command[1] in _kubectl_commands()
    return None, True


def _kubectl_commands() -> set[str]:
    parser = kubectl_plugin._parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(commands.choices)


def test_every_row_names_an_equivalent_or_says_why_not(rows: list[Row]) -> None:
    vague = []
    for row in rows:
        cited = [t for t in row.names() if _is_fracgpu_name(t)]
        if not cited and not any(phrase in row.fracgpu for phrase in NO_EQUIVALENT):
            vague.append(f"{row.section}: {row.source}")
    assert vague == [], f"rows with neither a fracgpu name nor a reason: {vague}"


def _is_fracgpu_name(token: str) -> bool:
    shapes = (FLAG, ENV, CHART_VALUE, CRD_FIELD, QUALIFIED, KUBECTL)
    return any(s.match(_head(token)) for s in shapes) or bool(METRIC.search(token))


def _head(token: str) -> str:
    """The name in `name: value` or `name=value`."""
    return re.split(r"[:=]", token, maxsplit=1)[0].strip()


def test_every_dialect_knob_of_fracgpu_is_mapped(rows: list[Row]) -> None:
    cited = " ".join(row.fracgpu for row in rows)
    dialect_names = [
        value
        for key, value in vars(names).items()
        if key.startswith(("RESOURCE_", "HAMI_ANNOTATION_")) and isinstance(value, str)
    ]
    dialect_settings = [
        o.flag
        for o in webhook_settings.OPTIONS
        if o.key.startswith("resource_")
        or o.key
        in {
            "default_gpu_memory",
            "default_gpu_cores",
            "default_gpu_count",
            "gpushare_memory_unit",
            "split_count",
            "memory_scaling",
            "disable_core_limit",
            "policy",
        }
    ]
    wanted = [*dialect_names, *names.USER_ANNOTATIONS, *dialect_settings]
    wanted += ["agent.gpuManagerMetrics", names.NAMESPACE_LABEL_OPT_OUT]
    missing = [n for n in wanted if f"`{n}`" not in cited]
    assert missing == [], f"not mapped in docs/migration.md: {missing}"


@pytest.mark.parametrize("section", SOURCES)
def test_every_knob_of_the_source_system_is_listed(rows: list[Row], section: str) -> None:
    listed = " ".join(row.source for row in rows if row.section == section)
    missing = [knob for knob in SOURCE_KNOBS[section] if knob not in listed]
    assert missing == [], f"{section}: not listed: {missing}"


def test_mig_section_says_what_mixed_would_need() -> None:
    text = DOC.read_text()
    mig = text[text.index("## MIG") : text.index("## Checking the result")]
    for topic in ("migStrategy: mixed", "profile", "MIG-", "device plugin", "shim", "Quota"):
        assert topic in mig, topic
