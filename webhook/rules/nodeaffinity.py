"""Which nodes a pod's own scheduling constraints allow: nodeSelector and required node affinity.

fracgpu pins a pod to the node it chooses; choosing a node the pod itself excludes would
leave it Pending forever. This follows the scheduler's rules: nodeSelector entries must all
match, required ``nodeSelectorTerms`` are ORed, the requirements inside a term are ANDed.

The work is linear in the pod and does not multiply by the node count: node sets are bit
masks (an int, one bit per node) from an index of the nodes' labels, built once per label
snapshot (``NodeIndex``). A requirement costs one mask lookup per value (``In``, ``NotIn``),
one lookup (``Exists``, ``DoesNotExist``) or a binary search (``Gt``, ``Lt``); terms combine
masks with AND and OR, a handful of machine words per operation, and each distinct
requirement is evaluated once per pod.
"""

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from webhook.rules import pod as podlib

NODE_NAME_FIELD: Final = "metadata.name"
_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_TERMS_PATH: Final = ".spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"

# (operator, key, values, is a field) of one requirement, as read from the pod.
Requirement = tuple[str, str, tuple[str, ...], bool]


@dataclass
class NodeIndex:
    """Nodes' labels as bit masks; built from one ``node_labels`` snapshot."""

    names: tuple[str, ...]
    everyone: int
    bit: dict[str, int]
    by_value: dict[str, dict[str, int]]
    by_key: dict[str, int]
    # key -> (sorted integer label values, mask of nodes above each), built when first asked
    _numeric: dict[str, tuple[list[int], list[int], list[int]]] = field(default_factory=dict)

    @classmethod
    def build(cls, node_labels: Mapping[str, Mapping[str, str]]) -> "NodeIndex":
        names = tuple(node_labels)
        bit = {name: 1 << i for i, name in enumerate(names)}
        by_value: dict[str, dict[str, int]] = {}
        for name, labels in node_labels.items():
            mask = bit[name]
            for key, value in labels.items():
                values = by_value.setdefault(key, {})
                values[value] = values.get(value, 0) | mask
        by_key = {}
        for key, values in by_value.items():
            combined = 0
            for mask in values.values():
                combined |= mask
            by_key[key] = combined
        return cls(names, (1 << len(names)) - 1, bit, by_value, by_key)

    def nodes(self, mask: int) -> set[str]:
        if mask == self.everyone:
            return set(self.names)
        bits = f"{mask:b}"[::-1]  # bit i is character i: one pass in C, then one step per node
        found = set()
        at = bits.find("1")
        while at >= 0:
            found.add(self.names[at])
            at = bits.find("1", at + 1)
        return found

    def compare(self, key: str, bound: int, above: bool) -> int:
        """Nodes whose label ``key`` is an integer above (or below) ``bound``."""
        numeric = self._numeric.get(key)
        if numeric is None:
            pairs = sorted(
                (int(value), mask)
                for value, mask in self.by_value.get(key, {}).items()
                if _is_integer(value)
            )
            numbers = [n for n, _ in pairs]
            below = [0]
            for _, mask in pairs:
                below.append(below[-1] | mask)
            above_masks = [0]
            for _, mask in reversed(pairs):
                above_masks.append(above_masks[-1] | mask)
            numeric = self._numeric[key] = (numbers, below, above_masks[::-1])
        numbers, below, above_masks = numeric
        if above:
            return above_masks[bisect.bisect_right(numbers, bound)]
        return below[bisect.bisect_left(numbers, bound)]


class NodeIndexCache:
    """The index of the latest label snapshot: back ends hand out the same mapping until
    a node changes, so an index is built once per change, not once per pod."""

    def __init__(self) -> None:
        self._labels: Mapping[str, Mapping[str, str]] | None = None
        self._index: NodeIndex | None = None

    def get(self, node_labels: Mapping[str, Mapping[str, str]]) -> NodeIndex:
        if self._index is None or node_labels is not self._labels:
            self._index = NodeIndex.build(node_labels)
            self._labels = node_labels
        return self._index


def allowed_nodes(
    pod: Mapping[str, Any],
    node_labels: Mapping[str, Mapping[str, str]],
    cache: NodeIndexCache | None = None,
) -> set[str] | None:
    """Nodes (of ``node_labels``) the pod may run on; None when the pod restricts nothing."""
    pod_spec = podlib.spec(pod)
    selector = _selector(pod_spec)
    terms = _required_terms(pod_spec)
    if not selector and terms is None:
        return None
    index = (cache or NodeIndexCache()).get(node_labels)
    allowed = index.everyone
    for key, value in selector:
        allowed &= index.by_value.get(key, {}).get(value, 0)
    if terms is not None:
        matched = 0
        evaluated: dict[Requirement, int] = {}
        for term in terms:
            if not term:
                continue  # an empty term matches no node (as in the scheduler)
            mask = index.everyone
            for requirement in term:
                result = evaluated.get(requirement)
                if result is None:
                    result = evaluated[requirement] = _evaluate(requirement, index)
                mask &= result
            matched |= mask
        allowed &= matched
    return index.nodes(allowed)


def _selector(pod_spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    raw = podlib.mapping_at(pod_spec, "nodeSelector", ".spec")
    for key, value in raw.items():
        if not isinstance(value, str):
            raise podlib.PodShapeError(f".spec.nodeSelector[{key}]", "must be a string")
    return [(str(k), v) for k, v in raw.items()]


def _required_terms(pod_spec: Mapping[str, Any]) -> list[list[Requirement]] | None:
    """Each term's requirements, shape-checked; None when the pod has no required terms."""
    affinity = podlib.mapping_at(pod_spec, "affinity", ".spec")
    node_affinity = podlib.mapping_at(affinity, "nodeAffinity", ".spec.affinity")
    required = podlib.mapping_at(
        node_affinity,
        "requiredDuringSchedulingIgnoredDuringExecution",
        ".spec.affinity.nodeAffinity",
    )
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        return None
    if not isinstance(terms, list) or not all(isinstance(t, Mapping) for t in terms):
        raise podlib.PodShapeError(f"{_TERMS_PATH}.nodeSelectorTerms", "must be a list of objects")
    return [
        _requirements(term, "matchExpressions", f"{_TERMS_PATH}.nodeSelectorTerms[{index}]")
        + _requirements(term, "matchFields", f"{_TERMS_PATH}.nodeSelectorTerms[{index}]")
        for index, term in enumerate(terms)
    ]


def _requirements(term: Mapping[str, Any], key: str, path: str) -> list[Requirement]:
    items = term.get(key) or []
    if not isinstance(items, list):
        raise podlib.PodShapeError(f"{path}.{key}", "must be a list")
    found = []
    for i, item in enumerate(items):
        if (
            not isinstance(item, Mapping)
            or not isinstance(item.get("key"), str)
            or item.get("operator") not in _OPERATORS
        ):
            raise podlib.PodShapeError(
                f"{path}.{key}[{i}]", f"needs a key and an operator ({', '.join(_OPERATORS)})"
            )
        values = item.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise podlib.PodShapeError(f"{path}.{key}[{i}].values", "must be a list of strings")
        found.append((item["operator"], item["key"], tuple(values), key == "matchFields"))
    return found


def _evaluate(requirement: Requirement, index: NodeIndex) -> int:
    operator, key, values, is_field = requirement
    if is_field:
        present = index.everyone if key == NODE_NAME_FIELD else 0
        matching = _any_of(values, index.bit) if key == NODE_NAME_FIELD else 0
    else:
        present = index.by_key.get(key, 0)
        matching = _any_of(values, index.by_value.get(key, {}))
    if operator == "In":
        return matching
    if operator == "NotIn":
        return index.everyone & ~matching
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return index.everyone & ~present
    # Gt / Lt compare integers; a label that is not one does not match, nor does any node
    # when the bound is not one. Fields have no integer values.
    if is_field or not values or not _is_integer(values[0]):
        return 0
    return index.compare(key, int(values[0]), above=operator == "Gt")


def _any_of(values: Sequence[str], masks: Mapping[str, int]) -> int:
    mask = 0
    for value in values:
        mask |= masks.get(value, 0)
    return mask


def _is_integer(text: str) -> bool:
    """Whether ``text`` is an integer the scheduler could compare (64 bits: 20 characters)."""
    if len(text) > 20:
        return False
    try:
        int(text)
    except ValueError:
        return False
    return True
