"""Which nodes' taints a pod tolerates (NoSchedule and NoExecute; PreferNoSchedule is a hint).

A pod pinned to a node whose taint it does not tolerate would never be scheduled there.
Matching follows the scheduler: ``Exists`` ignores the value (and with no key matches every
taint), ``Equal`` (the default) needs key and value; an empty effect matches every effect.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from webhook import pod as podlib

BLOCKING_EFFECTS: Final = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""


def untolerated_nodes(
    pod: Mapping[str, Any], node_taints: Mapping[str, Sequence[Taint]]
) -> set[str]:
    """Nodes with a blocking taint the pod does not tolerate (untainted nodes never are)."""
    blocking = {
        node: [t for t in taints if t.effect in BLOCKING_EFFECTS]
        for node, taints in node_taints.items()
    }
    if not any(blocking.values()):
        return set()
    tolerations = _tolerations(pod)
    return {
        node
        for node, taints in blocking.items()
        if not all(any(_tolerates(t, taint) for t in tolerations) for taint in taints)
    }


def _tolerations(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = podlib.spec(pod).get("tolerations") or []
    if not isinstance(items, list) or not all(isinstance(t, Mapping) for t in items):
        raise podlib.PodShapeError(".spec.tolerations", "must be a list of objects")
    return items


def _tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator") == "Exists":
        return not key or key == taint.key
    return key == taint.key and (toleration.get("value") or "") == taint.value
