"""The cluster file: nodes, GPUs, assigned pods, namespaces and quotas, read and checked.

The embedded back end (``webhook.state.embedded``) holds what it describes. Format (see
examples/cluster.yaml)::

    nodes:        [{name, cpu, memory, pool?, splitCount?, memoryScaling?, disableCoreLimit?,
                    labels?, taints?: [{key, value?, effect}],
                    gpus: [{uuid, index, model, memoryMiB, healthy?, migEnabled?}]}]
    pods:         [{namespace, name, node, cpu?, memory?, containers: [{name,
                    devices: [{uuid, cores, memoryMiB}]}]}]          # already assigned
    namespaces:   [{name, labels}]      # label fracgpu.io/ignore: "true" opts out
    quotas:       [GPUQuota objects: {metadata: {namespace, name}, spec: {hard, models, pools}}]

Every entry is checked; an error names the file once, then the entry and field
(``nodes[0].cpu``), and what is allowed.
"""

import json
from collections.abc import Mapping, Set
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

from fracgpu import codec
from fracgpu.errors import CodecError, FracgpuError, QuantityError
from fracgpu.model import GPUAllocation, NodeInventory, Quota
from fracgpu.quantity import parse_quantity, shown
from webhook import documents
from webhook.rules.tolerations import Taint

HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
_NODE_REQUIRED: Final = frozenset({"name", "cpu", "memory", "gpus"})
_NODE_KEYS: Final = _NODE_REQUIRED | {
    "pool",
    "splitCount",
    "memoryScaling",
    "disableCoreLimit",
    "labels",
    "taints",
}
_TAINT_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")


class ClusterFileError(FracgpuError):
    """The cluster file is not usable; the message names the entry and what is allowed."""


@dataclass(frozen=True)
class AssignedPod:
    namespace: str
    name: str
    node: str
    allocations: tuple[GPUAllocation, ...]
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True)
class ClusterFile:
    nodes: tuple[NodeInventory, ...]
    # Node labels; kubernetes.io/hostname is set to the node name as kubelet does.
    node_labels: Mapping[str, Mapping[str, str]]
    node_taints: Mapping[str, tuple[Taint, ...]]
    pods: tuple[AssignedPod, ...]
    namespace_labels: Mapping[str, Mapping[str, str]]
    quotas: tuple[Quota, ...]


def load_cluster_file(path: Path) -> ClusterFile:
    try:
        raw = documents.load(path)
    except documents.DocumentError as error:
        raise ClusterFileError(f"cluster file {error}") from None
    return _cluster(raw, str(path))


def parse_cluster(text: str, source: str = "cluster file") -> ClusterFile:
    try:
        raw = documents.parse(text, source)
    except documents.DocumentError as error:
        raise ClusterFileError(str(error)) from None
    return _cluster(raw, source)


def _cluster(raw: Any, source: str) -> ClusterFile:
    # Below, every message starts with its entry and field (nodes[0].cpu); the file is
    # named here, once.
    try:
        return _read(raw)
    except FracgpuError as error:
        raise ClusterFileError(f"{source}: {error}") from None


def _read(raw: Any) -> ClusterFile:
    if not isinstance(raw, dict):
        raise ClusterFileError("the top level must be a mapping with nodes, pods...")
    unknown = raw.keys() - {"apiVersion", "kind", "nodes", "pods", "namespaces", "quotas"}
    if unknown:
        raise ClusterFileError(
            f"unknown key(s) {', '.join(sorted(map(str, unknown)))}: "
            "use nodes, pods, namespaces, quotas"
        )
    raw_nodes = _list(raw, "nodes")
    nodes = tuple(_node(f"nodes[{i}]", n) for i, n in enumerate(raw_nodes))
    node_labels = {
        node.name: {HOSTNAME_LABEL: node.name, **_labels(f"nodes[{i}]", n, _NODE_KEYS)}
        for i, (node, n) in enumerate(zip(nodes, raw_nodes, strict=True))
    }
    by_name = {n.name: n for n in nodes}
    if len(by_name) != len(nodes):
        raise ClusterFileError("nodes: a node name appears twice")
    uuids = [d.uuid for n in nodes for d in n.devices]
    if len(set(uuids)) != len(uuids):
        raise ClusterFileError("nodes: a GPU UUID appears twice")
    node_taints = {
        node.name: _taints(f"nodes[{i}].taints", n.get("taints"))
        for i, (node, n) in enumerate(zip(nodes, raw_nodes, strict=True))
    }
    pods = tuple(_pod(f"pods[{i}]", p, by_name) for i, p in enumerate(_list(raw, "pods")))
    namespaces = {
        _str(f"namespaces[{i}]", ns, "name"): _labels(f"namespaces[{i}]", ns, {"name", "labels"})
        for i, ns in enumerate(_list(raw, "namespaces"))
    }
    quotas = tuple(_quota(f"quotas[{i}]", q) for i, q in enumerate(_list(raw, "quotas")))
    return ClusterFile(nodes, node_labels, node_taints, pods, namespaces, quotas)


def _quota(what: str, raw: object) -> Quota:
    try:
        return codec.decode_quota(raw)
    except CodecError as error:
        raise ClusterFileError(f"{what}: {error}") from None


def _node(what: str, raw: object) -> NodeInventory:
    obj = _mapping(what, raw, set(_NODE_REQUIRED), set(_NODE_KEYS - _NODE_REQUIRED))
    gpus = obj["gpus"]
    if not isinstance(gpus, list):
        raise ClusterFileError(f"{what}.gpus: must be a list of GPUs")
    devices = codec.decode_devices(
        f"{what}.gpus", [{"healthy": True, **g} if isinstance(g, dict) else g for g in gpus]
    )
    split = obj.get("splitCount")
    if split is not None and (not isinstance(split, int) or isinstance(split, bool) or split < 1):
        raise ClusterFileError(f"{what}.splitCount: use a whole number of 1 or more")
    scaling = obj.get("memoryScaling")
    if scaling is not None:
        try:
            scaling = codec.decode_memory_scaling(what, scaling)
        except CodecError as error:
            raise ClusterFileError(str(error)) from None
    disable_core_limit = obj.get("disableCoreLimit")
    if disable_core_limit is not None and not isinstance(disable_core_limit, bool):
        raise ClusterFileError(f"{what}.disableCoreLimit: use true or false")
    return NodeInventory(
        name=_str(what, obj, "name"),
        devices=devices,
        cpu_milli=_cpu(what, obj["cpu"]),
        memory_mib=_memory(what, obj["memory"]),
        pool=str(obj.get("pool", "")),
        split_count=split,
        memory_scaling=scaling,
        compute_limit=None if disable_core_limit is None else not disable_core_limit,
    )


def _pod(what: str, raw: object, nodes: Mapping[str, NodeInventory]) -> AssignedPod:
    obj = _mapping(what, raw, {"namespace", "name", "node", "containers"}, {"cpu", "memory"})
    node = _str(what, obj, "node")
    if node not in nodes:
        raise ClusterFileError(f"{what}.node: {node!r} is not one of the nodes")
    payload = {
        "version": codec.ASSIGNMENT_VERSION,
        "node": node,
        "reservationId": f"embedded-{_str(what, obj, 'name')}",
        "containers": obj["containers"],
    }
    assignment = codec.decode_assignment(json.dumps(payload), what)
    on_node = {d.uuid for d in nodes[node].devices}
    for alloc in assignment.allocations():
        if alloc.uuid not in on_node:
            raise ClusterFileError(f"{what}: GPU {alloc.uuid} is not on node {node}")
    return AssignedPod(
        namespace=_str(what, obj, "namespace"),
        name=_str(what, obj, "name"),
        node=node,
        allocations=assignment.allocations(),
        cpu_milli=_cpu(what, obj.get("cpu", 0)),
        memory_mib=_memory(what, obj.get("memory", 0)),
    )


def _taints(what: str, raw: object) -> tuple[Taint, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ClusterFileError(f"{what}: must be a list of {{key, value, effect}}")
    taints = []
    for i, item in enumerate(raw):
        obj = _mapping(f"{what}[{i}]", item, {"key", "effect"}, {"value"})
        if obj["effect"] not in _TAINT_EFFECTS:
            raise ClusterFileError(f"{what}[{i}].effect: use {', '.join(_TAINT_EFFECTS)}")
        taints.append(
            Taint(_str(f"{what}[{i}]", obj, "key"), obj["effect"], str(obj.get("value", "")))
        )
    return tuple(taints)


def _labels(what: str, raw: object, keys: Set[str]) -> Mapping[str, str]:
    obj = _mapping(what, raw, {"name"}, set(keys - {"name"}))
    labels = obj.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ClusterFileError(f"{what}.labels: must map label names to string values")
    return {str(k): v for k, v in labels.items()}


def _mapping(what: str, raw: object, required: set[str], optional: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ClusterFileError(f"{what}: must be a mapping")
    missing = required - raw.keys()
    if missing:
        raise ClusterFileError(f"{what}: missing {', '.join(sorted(missing))}")
    unknown = raw.keys() - required - optional
    if unknown:
        raise ClusterFileError(
            f"{what}: unknown key(s) {', '.join(sorted(map(str, unknown)))}: "
            f"allowed are {', '.join(sorted(required | optional))}"
        )
    return raw


def _list(raw: Mapping[str, Any], key: str) -> list[Any]:
    value = raw.get(key) or []
    if not isinstance(value, list):
        raise ClusterFileError(f"{key}: must be a list")
    return value


def _str(what: str, obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise ClusterFileError(f"{what}.{key}: must be a non-empty string")
    return value


def _cpu(what: str, raw: object) -> int:
    return int(-(-_amount(f"{what}.cpu", raw) * 1000 // 1))


def _memory(what: str, raw: object) -> int:
    return int(-(-_amount(f"{what}.memory", raw) // 2**20))


def _amount(what: str, raw: object) -> Fraction:
    try:
        value = parse_quantity(raw)
    except QuantityError as error:
        raise ClusterFileError(f"{what}: {error}") from None
    if value < 0:
        raise ClusterFileError(f"{what}: {shown(raw)} is negative: use a quantity of 0 or more")
    return value
