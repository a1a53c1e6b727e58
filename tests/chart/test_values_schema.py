"""values.schema.json accepts the chart's own values files and rejects bad values."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema
import pytest
import yaml

from fracgpu.placement import Policy
from tests.chart.chartfiles import CHART_DIR
from tests.chart.render import render
from tests.chart.render_setup import renderer_or_skip
from webhook import settings

Values = dict[str, Any]


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART_DIR / "values.schema.json").read_text())
    return schema


def _validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(
        _schema(), format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
    )


def _defaults() -> Values:
    values: Values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return values


def _merged(base: Values, override: Values) -> Values:
    """Helm's merge of a -f file over values.yaml: maps merge, null deletes, the rest replaces."""
    result = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = _merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _with(path: str, value: Any) -> Values:
    """The defaults with one dotted path set (``None`` deletes the key)."""
    values = _defaults()
    *parents, last = path.split(".")
    node = values
    for key in parents:
        node = node[key]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return values


def _errors(values: Values) -> list[str]:
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in _validator().iter_errors(values)]


def test_schema_is_draft7() -> None:
    schema = _schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)


def test_default_values_are_valid() -> None:
    assert _errors(_defaults()) == []


def test_hami_profile_is_valid() -> None:
    hami = yaml.safe_load((CHART_DIR / "values-hami.yaml").read_text())
    assert _errors(_merged(_defaults(), hami)) == []


def test_profiles_keep_resource_names_distinct() -> None:
    # The webhook refuses to start when two resource names are equal.
    hami = yaml.safe_load((CHART_DIR / "values-hami.yaml").read_text())
    for values in (_defaults(), _merged(_defaults(), hami)):
        names = list(values["resourceNames"].values())
        assert len(set(names)) == len(names), names


def test_memory_scaling_accepts_the_webhooks_range() -> None:
    for factor in (1, 1.5, 16):
        assert _errors(_with("webhook.memoryScaling", factor)) == [], factor


def test_placement_policy_takes_every_policy_the_webhook_has() -> None:
    # The schema once refused fgd, which FRACGPU_POLICY and the annotation accept.
    placement = _schema()["properties"]["webhook"]["properties"]["placementPolicy"]
    assert placement["enum"] == [policy.value for policy in Policy]
    for policy in Policy:
        assert _errors(_with("webhook.placementPolicy", policy.value)) == [], policy


def test_hami_profile_differs_where_it_says() -> None:
    hami = _merged(_defaults(), yaml.safe_load((CHART_DIR / "values-hami.yaml").read_text()))
    assert hami["resourceNames"]["hamiGpu"] == "nvidia.com/gpu"
    assert hami["resourceNames"]["vcudaCore"] != _defaults()["resourceNames"]["vcudaCore"]
    assert hami["agent"]["nodeSelector"] == {"gpu": "on"}


BAD_VALUES = [
    ("unknown top-level key", "replicas", 2),
    ("unknown nested key", "webhook.replica", 2),
    ("negative replicas", "webhook.replicas", -1),
    ("zero replicas", "webhook.replicas", 0),
    ("replicas as string", "webhook.replicas", "2"),
    ("bad placement policy", "webhook.placementPolicy", "random"),
    ("placement policy wrong case", "webhook.placementPolicy", "Binpack"),
    ("split count above 100", "webhook.splitCount", 101),
    ("memory scaling below 1", "webhook.memoryScaling", 0.5),
    ("memory scaling above 16", "webhook.memoryScaling", 16.5),
    ("memory scaling as string", "webhook.memoryScaling", "2"),
    ("disableCoreLimit as string", "webhook.disableCoreLimit", "true"),
    ("missing disableCoreLimit", "webhook.disableCoreLimit", None),
    ("cores above 100", "webhook.defaultGpuCores", 150),
    ("memory percentage above 100", "webhook.defaultGpuMemory", "150%"),
    ("memory with a byte unit", "webhook.defaultGpuMemory", "4GB"),
    ("gpushare unit", "webhook.gpushareMemoryUnit", "GB"),
    ("log level", "webhook.logLevel", "verbose"),
    ("port out of range", "webhook.port", 70000),
    ("webhook timeout above 30", "webhooks.timeoutSeconds", 31),
    ("unknown failure policy", "webhooks.failurePolicy", "Sometimes"),
    ("lower-case update failure policy", "webhooks.updateFailurePolicy", "ignore"),
    (
        "selector operator that is not one",
        "webhooks.objectSelector",
        {"matchExpressions": [{"key": "gpu", "operator": "Like", "values": ["x"]}]},
    ),
    ("selector with an unknown field", "webhooks.namespaceSelector", {"matchFields": []}),
    ("label value too long", "webhooks.namespaceSelector", {"matchLabels": {"team": "x" * 64}}),
    ("exempt namespace not a DNS label", "webhooks.extraExemptNamespaces", ["Team_A"]),
    ("matchConditions not a boolean", "webhooks.matchConditions.enabled", "yes"),
    ("unqualified resource name", "resourceNames.vcudaCore", "vcuda-core"),
    ("GPU node taint not a taint key", "webhook.gpuNodeTaint", "gpu node"),
    ("GPU node taint with an empty name", "webhook.gpuNodeTaint", "fracgpu.io/"),
    ("missing resource name", "resourceNames.vcudaMemory", None),
    ("pull policy", "image.pullPolicy", "Sometimes"),
    ("registry with a trailing slash", "image.registry", "registry.example.com/"),
    ("registry with a scheme", "image.registry", "https://registry.example.com"),
    ("registry with a space", "image.registry", "registry example"),
    ("anti-affinity", "webhook.antiAffinity", "strict"),
    ("certs mode", "certs.mode", "vault"),
    ("certs validity not a duration", "certs.servingValidity", "one year"),
    ("renew window above 99%", "certs.servingRenewBefore", "150%"),
    ("extra IP not an address", "certs.extraIpAddresses", ["10.0.0.300"]),
    ("issuer kind", "certs.certManager.issuerRef", {"name": "x", "kind": "Vault"}),
    ("issuer without name", "certs.certManager.issuerRef", {"kind": "ClusterIssuer"}),
    ("agent metrics port zero", "agent.metricsPort", 0),
    ("agent host dir relative", "agent.hostDir", "var/lib/fracgpu"),
    ("agent privileged as string", "agent.privileged", "false"),
    ("agent negative xid", "agent.ignoredXids", [-1]),
    ("agent poll seconds zero", "agent.kubeletPollSeconds", 0),
    ("context overhead negative", "agent.contextOverheadBytes", -1),
    ("context overhead past 4 GiB", "agent.contextOverheadBytes", (4 << 30) + 1),
    ("node selector value not a string", "agent.nodeSelector", {"gpu": True}),
    ("PDB minAvailable negative", "webhook.podDisruptionBudget.minAvailable", -1),
    ("update strategy zero", "agent.updateStrategy.maxUnavailable", 0),
    ("monitoring flag type", "monitoring.serviceMonitor.enabled", "true"),
]


@pytest.mark.parametrize(
    ("path", "value"), [(p, v) for _, p, v in BAD_VALUES], ids=[label for label, _, _ in BAD_VALUES]
)
def test_bad_value_is_rejected(path: str, value: Any) -> None:
    errors = _errors(_with(path, value))
    assert errors, f"{path}={value!r} was accepted"


@pytest.mark.parametrize(
    "registry", ["registry.example.com", "localhost:5000", "ghcr.io/my-org", "r.io/a/b-c", ""]
)
def test_registries_as_images_name_them_are_accepted(registry: str) -> None:
    assert _errors(_with("image.registry", registry)) == []


def test_rejection_names_the_field() -> None:
    errors = _errors(_with("webhook.placementPolicy", "random"))
    assert any(e.startswith("webhook.placementPolicy:") and "binpack" in e for e in errors)


def test_every_default_value_is_described_by_the_schema() -> None:
    """Each key of values.yaml has a schema entry, so nothing escapes validation."""

    def walk(values: Any, schema: dict[str, Any], path: str) -> list[str]:
        if not isinstance(values, dict) or "properties" not in schema:
            return []
        missing = []
        for key, value in values.items():
            sub = schema["properties"].get(key)
            if sub is None:
                missing.append(f"{path}{key}")
            else:
                missing += walk(value, sub, f"{path}{key}.")
        return missing

    assert walk(_defaults(), _schema(), "") == []


# Keys whose meaning is plain once their parent is described (image.tag, resources.limits).
SELF_EXPLAINING = frozenset(
    {"repository", "tag", "requests", "limits", "enabled", "labels", "interval", "minAvailable"}
)


def test_every_value_is_documented_by_a_comment() -> None:
    """values.yaml: every key has a comment right above it (or is a plain sub-key)."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    key_line = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9-]*):")
    undocumented = []
    parents: list[tuple[int, bool]] = []  # (indent, has its own comment) of enclosing keys
    for number, line in enumerate(lines):
        match = key_line.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        own_comment = number > 0 and lines[number - 1].strip().startswith("#")
        parent_commented = bool(parents) and parents[-1][1]
        # A documented map's entries: label keys (nvidia-device-enable) are data, not settings.
        is_data_key = "-" in match.group(2) or "." in match.group(2)
        plain = (match.group(2) in SELF_EXPLAINING or is_data_key) and parent_commented
        # Fields of a list entry (a toleration's operator) are described with the list.
        in_documented_group = parent_commented and _inside_list_entry(lines, number, indent)
        if not (own_comment or plain or in_documented_group):
            undocumented.append(f"line {number + 1}: {match.group(2)}")
        parents.append((indent, own_comment or plain or in_documented_group))
    assert not undocumented, "keys without a comment in values.yaml:\n" + "\n".join(undocumented)


def _inside_list_entry(lines: list[str], number: int, indent: int) -> bool:
    """Whether the key at ``number`` belongs to a ``- `` list entry above it."""
    for previous in reversed(lines[:number]):
        stripped = previous.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        if len(previous) - len(stripped) < indent:
            return stripped.startswith("- ")
    return False


# webhook.defaultGpuMemory feeds --default-gpu-memory (FRACGPU_DEFAULT_GPU_MEMORY): a share of
# the card, MiB as a whole number, or a Kubernetes quantity of bytes. Each value here goes to
# the schema and, rendered by the chart, to the webhook's settings loader: the two must agree.
MEMORY_VALUES: list[Any] = [
    # accepted by the webhook
    "100%",
    "1%",
    "050%",
    "4096",
    "0004096",
    5000,  # MiB, as docs/migration.md writes it
    1,
    "4Gi",
    "4G",  # 4 x 10^9 bytes
    "4096Mi",
    "+4Gi",
    "1.5Gi",
    ".5Gi",
    "5.",
    "1500m",
    "1e3",
    "1E3",
    "1e+018",
    "7Ei",
    "1k",
    "4096Ki",
    # refused by the webhook
    "0%",
    "101%",
    "%",
    "50.5%",
    "+50%",
    0,
    -1,
    "0",
    "000",
    "-4Gi",
    "-0.5",
    "4GB",
    "4gi",
    "4K",
    "1e31",
    "1e",
    "0.0Gi",
    ".0",
    "4 Gi",
    "",
    "4Gi ",
    "lots",
    "1" + "0" * 70 + "k",  # a quantity longer than the 64 characters allowed
]
# What the schema cannot tell by pattern, left to the settings-check hook: quantities whose
# bytes round down to none, or beyond 2^63-1 bytes (8 EiB). The webhook refuses them.
MEMORY_LEFT_TO_THE_HOOK: list[Any] = ["500m", "1e-030", "0.0001Ki", "2e+30", "8Ei"]


@pytest.fixture(scope="module")
def renderer() -> Any:
    return renderer_or_skip()


def _memory_verdicts(renderer: Any, value: Any) -> tuple[bool, bool, str, str]:
    """(the schema accepts, the webhook accepts the rendered value, that value, why)."""
    schema_accepts = _errors(_with("webhook.defaultGpuMemory", value)) == []
    rendered = render(renderer=renderer, values={"webhook": {"defaultGpuMemory": value}})
    deployment = rendered.one("Deployment", "fracgpu-webhook")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (env,) = [e["value"] for e in container["env"] if e["name"] == "FRACGPU_DEFAULT_GPU_MEMORY"]
    try:
        loaded = settings.load(None, {"FRACGPU_DEFAULT_GPU_MEMORY": env})
    except settings.SettingsError as error:
        return schema_accepts, False, env, str(error)
    return schema_accepts, True, env, str(loaded.dialects.default_memory)


@pytest.mark.parametrize("value", MEMORY_VALUES, ids=[repr(v) for v in MEMORY_VALUES])
def test_default_gpu_memory_schema_accepts_what_the_webhook_accepts(
    renderer: Any, value: Any
) -> None:
    schema_accepts, webhook_accepts, env, why = _memory_verdicts(renderer, value)
    assert schema_accepts == webhook_accepts, f"{value!r} rendered as {env!r}: {why}"
    if isinstance(value, int) and webhook_accepts:
        assert env == str(value)  # a bare number is MiB, as the webhook reads "5000"


@pytest.mark.parametrize(
    "value", MEMORY_LEFT_TO_THE_HOOK, ids=[repr(v) for v in MEMORY_LEFT_TO_THE_HOOK]
)
def test_default_gpu_memory_the_schema_lets_through_is_refused_by_the_webhook(
    renderer: Any, value: Any
) -> None:
    """Never the other way round: the schema refuses nothing the webhook takes."""
    schema_accepts, webhook_accepts, env, why = _memory_verdicts(renderer, value)
    assert schema_accepts and not webhook_accepts, (value, env, why)
