"""Which nodes a pod's own scheduling constraints allow: nodeSelector and required node affinity.

fracgpu pins a pod to the node it chooses; choosing a node the pod itself excludes would
leave it Pending forever. This follows the scheduler's rules: nodeSelector entries must all
match, required ``nodeSelectorTerms`` are ORed, the requirements inside a term are ANDed.
"""

from collections.abc import Collection, Mapping
from typing import Any, Final

from webhook import pod as podlib

NODE_NAME_FIELD: Final = "metadata.name"
_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def allowed_nodes(
    pod: Mapping[str, Any], node_labels: Mapping[str, Mapping[str, str]]
) -> set[str] | None:
    """Nodes (of ``node_labels``) the pod may run on; None when the pod restricts nothing."""
    pod_spec = podlib.spec(pod)
    selector = podlib.mapping_at(pod_spec, "nodeSelector", ".spec")
    terms = _required_terms(pod_spec)
    if not selector and terms is None:
        return None
    allowed = set()
    for node, labels in node_labels.items():
        if all(labels.get(str(k)) == v for k, v in selector.items()) and (
            terms is None or any(_term_matches(t, i, node, labels) for i, t in enumerate(terms))
        ):
            allowed.add(node)
    return allowed


def _required_terms(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
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
        raise podlib.PodShapeError(
            ".spec.affinity.nodeAffinity.required...nodeSelectorTerms", "must be a list of objects"
        )
    return terms


def _term_matches(
    term: Mapping[str, Any], index: int, node: str, labels: Mapping[str, str]
) -> bool:
    path = f".spec.affinity.nodeAffinity.required...nodeSelectorTerms[{index}]"
    expressions = _requirements(term, "matchExpressions", path)
    fields = _requirements(term, "matchFields", path)
    if not expressions and not fields:
        return False  # an empty term matches no node (as in the scheduler)
    return all(_matches(r, labels.get(r["key"])) for r in expressions) and all(
        _matches(r, node if r["key"] == NODE_NAME_FIELD else None) for r in fields
    )


def _requirements(term: Mapping[str, Any], key: str, path: str) -> list[Mapping[str, Any]]:
    items = term.get(key) or []
    if not isinstance(items, list):
        raise podlib.PodShapeError(f"{path}.{key}", "must be a list")
    for i, item in enumerate(items):
        if (
            not isinstance(item, Mapping)
            or not isinstance(item.get("key"), str)
            or item.get("operator") not in _OPERATORS
        ):
            raise podlib.PodShapeError(
                f"{path}.{key}[{i}]", f"needs a key and an operator ({', '.join(_OPERATORS)})"
            )
    return items


def _matches(requirement: Mapping[str, Any], value: str | None) -> bool:
    operator = requirement["operator"]
    values: Collection[Any] = requirement.get("values") or []
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    # Gt / Lt compare integers; a label that is not one does not match.
    try:
        number, bound = int(value or ""), int(next(iter(values)))
    except (ValueError, StopIteration):
        return False
    return number > bound if operator == "Gt" else number < bound
