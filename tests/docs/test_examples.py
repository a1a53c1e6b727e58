"""Every manifest under examples/ parses, and every pod example gets the verdict its header
promises (``# expect: ...``) from the real webhook over HTTPS, fed in file order against
examples/cluster.yaml as ``fracgpu demo`` feeds them. The GPUNode and GPUQuota examples are
the objects the cluster file holds, and their fields exist in the CRD schemas.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fracgpu import names
from fracgpu.codec import decode_assignment
from fracgpu.dialects import DialectConfig
from fracgpu.model import Assignment
from tests.chart import crdschema
from tests.webhook.support import Webhook, start_webhook, stop_webhook
from webhook import settings
from webhook.state.clusterfile import ClusterFile, load_cluster_file
from webhook.state.embedded import EmbeddedState

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
CLUSTER_FILE = EXAMPLES / "cluster.yaml"
POD_FILES = sorted((EXAMPLES / "pods").glob("*.yaml"))
QUOTA_FILES = sorted((EXAMPLES / "quotas").glob("*.yaml"))
GPUNODE_FILES = sorted((EXAMPLES / "gpunodes").glob("*.yaml"))
# "# expect: admitted [on NODE]", "# expect: denied: MESSAGE PART", "# expect: allowed, patched"
EXPECT = re.compile(
    r"^# expect: (?:(?P<admitted>admitted)(?: on (?P<node>\S+))?"
    r"|denied: (?P<denied>.+)|allowed, (?P<allowed>patched|unchanged))$",
    re.MULTILINE,
)
# Cluster-file node keys that mirror GPUNode spec fields.
NODE_SPEC_KEYS = ("pool", "splitCount", "memoryScaling", "disableCoreLimit")


@dataclass(frozen=True)
class Expectation:
    verdict: str  # admitted, denied, patched or unchanged
    node: str | None = None
    message: str | None = None


def expectation(path: Path) -> Expectation:
    matches = list(EXPECT.finditer(path.read_text()))
    assert len(matches) == 1, f"{path.name}: needs exactly one '# expect: ...' header line"
    found = matches[0]
    if found["admitted"]:
        return Expectation("admitted", node=found["node"])
    if found["denied"]:
        return Expectation("denied", message=found["denied"])
    return Expectation(found["allowed"])


def documents(path: Path) -> list[dict[str, Any]]:
    loaded = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert loaded and all(isinstance(doc, dict) for doc in loaded), f"{path}: no objects"
    return loaded


def one(path: Path) -> dict[str, Any]:
    (document,) = documents(path)
    return document


def test_examples_exist_for_each_dialect_and_object() -> None:
    dialect_names = {
        "tkestack": (names.RESOURCE_VCUDA_CORE, names.RESOURCE_VCUDA_CORE_LIMIT),
        "hami": (names.RESOURCE_HAMI_GPU, names.HAMI_ANNOTATION_NOUSE_GPUUUID),
        "gpushare": (names.RESOURCE_GPUSHARE_MEM, names.RESOURCE_GPUSHARE_COUNT),
    }
    text = "\n".join(path.read_text() for path in POD_FILES)
    for dialect, keys in dialect_names.items():
        for key in keys:
            assert f"{key}:" in text, f"no pod example uses {key} ({dialect})"
    assert QUOTA_FILES and GPUNODE_FILES


@pytest.mark.parametrize(
    "path", sorted(EXAMPLES.rglob("*.yaml")), ids=lambda p: str(p.relative_to(EXAMPLES))
)
def test_every_example_parses(path: Path) -> None:
    if path == CLUSTER_FILE:
        assert load_cluster_file(path).nodes
        return
    kinds = {"pods": "Pod", "quotas": "GPUQuota", "gpunodes": "GPUNode"}
    for document in documents(path):
        assert document.get("kind") == kinds[path.parent.name], path
        assert document.get("apiVersion") == (
            "v1" if document["kind"] == "Pod" else names.API_VERSION
        )
        assert document.get("metadata", {}).get("name") or document["metadata"]["generateName"]
    if path.parent.name == "pods":
        expectation(path)


@pytest.mark.parametrize("path", QUOTA_FILES + GPUNODE_FILES, ids=lambda p: p.name)
def test_custom_resource_examples_fit_the_crd_schema(path: Path) -> None:
    document = one(path)
    problems = crdschema.problems(document)
    assert problems == [], f"{path.name}: {problems}"


def test_quota_examples_are_the_cluster_files_quotas() -> None:
    raw = yaml.safe_load(CLUSTER_FILE.read_text())
    in_cluster = {(q["metadata"]["namespace"], q["metadata"]["name"]): q for q in raw["quotas"]}
    for path in QUOTA_FILES:
        document = one(path)
        key = (document["metadata"]["namespace"], document["metadata"]["name"])
        assert key in in_cluster, f"{path.name}: GPUQuota {key} is not in cluster.yaml"
        assert in_cluster[key]["spec"] == document["spec"], f"{path.name} and cluster.yaml differ"


def test_gpunode_examples_are_the_cluster_files_nodes() -> None:
    raw = yaml.safe_load(CLUSTER_FILE.read_text())
    nodes = {n["name"]: n for n in raw["nodes"]}
    for path in GPUNODE_FILES:
        document = one(path)
        node = nodes.get(document["metadata"]["name"])
        assert node is not None, f"{path.name}: no node {document['metadata']['name']}"
        assert {k: node[k] for k in NODE_SPEC_KEYS if k in node} == document["spec"], path.name


@pytest.fixture
async def demo_webhook(tmp_path: Path) -> AsyncIterator[tuple[Webhook, ClusterFile]]:
    cluster = load_cluster_file(CLUSTER_FILE)
    defaults = settings.Settings()
    state = EmbeddedState(
        cluster,
        defaults.split_count,
        defaults.reservation_ttl_seconds,
        memory_scaling=defaults.memory_scaling,
    )
    hook = await start_webhook(tmp_path, state)
    try:
        yield hook, cluster
    finally:
        await stop_webhook(hook)


async def test_pod_examples_get_the_verdict_their_header_promises(
    demo_webhook: tuple[Webhook, ClusterFile],
) -> None:
    hook, cluster = demo_webhook
    seen = set()
    for path in POD_FILES:  # in order: each admitted pod holds its slice for the next ones
        pod = one(path)
        expected = expectation(path)
        result = await hook.admit(pod)
        where = f"{path.name}: {result.message}"
        seen.add(expected.verdict)
        if expected.verdict == "denied":
            assert not result.allowed, f"{path.name} was admitted"
            assert expected.message is not None and expected.message in result.message, where
            continue
        assert result.allowed, where
        annotation = result.pod["metadata"].get("annotations", {}).get(names.ANNOTATION_ASSIGNMENT)
        if expected.verdict != "admitted":
            assert annotation is None, f"{path.name} was placed"
            assert (result.pod != pod) == (expected.verdict == "patched"), path.name
            continue
        assert annotation is not None, f"{path.name} was allowed without a GPU assignment"
        assignment = decode_assignment(annotation)
        if expected.node is not None:
            assert assignment.node == expected.node, path.name
        check_assignment(path.name, pod, assignment, cluster)
    assert seen == {"admitted", "denied", "patched", "unchanged"}


def check_assignment(
    name: str, pod: Mapping[str, Any], assignment: Assignment, cluster: ClusterFile
) -> None:
    """The placement honours what the example asked for, read from the example itself."""
    node = next(n for n in cluster.nodes if n.name == assignment.node)
    models = {d.uuid: d.model for d in node.devices}
    uuids = {d.uuid for c in assignment.containers for d in c.devices}
    annotations = pod["metadata"].get("annotations", {})
    wanted = annotations.get(names.HAMI_ANNOTATION_USE_GPUTYPE)
    if wanted:
        assert all(wanted.lower() in models[u].lower() for u in uuids), name
    excluded = set(annotations.get(names.HAMI_ANNOTATION_NOUSE_GPUUUID, "").split(","))
    assert not uuids & excluded, f"{name} got an excluded GPU"
    for quota in cluster.quotas:
        if quota.namespace == pod["metadata"]["namespace"] and quota.pools:
            assert node.pool in quota.pools, f"{name} placed outside its quota's pools"
    for container in pod["spec"]["containers"]:
        limits = container.get("resources", {}).get("limits", {})
        held = assignment.for_container(container["name"])
        if held is None:
            continue
        # A container's own bound, else the pod's TKEStack annotation (shared GPUs only).
        bound = limits.get(names.RESOURCE_VCUDA_CORE_LIMIT) or (
            annotations.get(names.RESOURCE_VCUDA_CORE_LIMIT)
            if all(d.cores < names.CORES_PER_GPU for d in held.devices)
            else None
        )
        assert held.core_limit == (int(bound) if bound is not None else None), name
        count = limits.get(names.RESOURCE_GPUSHARE_COUNT) or limits.get(names.RESOURCE_HAMI_GPU)
        if count is not None:
            assert len(held.devices) == int(count), name
        gpumem = limits.get(names.RESOURCE_HAMI_GPUMEM)
        if gpumem is not None:
            assert all(d.memory_mib >= int(gpumem) for d in held.devices), name
    # The node's overrides travel with the assignment, so the agent applies what was planned.
    assert assignment.memory_scaling == (node.memory_scaling or 1.0), name
    assert assignment.compute_limit == (node.compute_limit is not False), name
    if assignment.memory_scaling > 1:
        physical = {d.uuid: d.memory_mib for d in node.devices}
        assert any(d.memory_mib > physical[d.uuid] for d in assignment.allocations()), (
            f"{name}: a memory-scaling example should ask for more than the physical memory"
        )


def test_the_troubleshooting_table_quotes_the_range_messages_as_they_are() -> None:
    """operations.md's table is searched for the text a user got: a range message that
    drifted from the code's (it did once) is found by nobody."""
    table = (REPO / "docs" / "operations.md").read_text()
    quoted = re.findall(r"\| `container \"\w+\": ([\w./-]+)=\d+ is not allowed: ([^`]+)` \|", table)
    assert len(quoted) >= 2
    ranges = DialectConfig().ranges
    for resource, message in quoted:
        assert message == ranges[resource].allowed, resource
