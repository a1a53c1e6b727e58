"""Which nodes' taints a pod tolerates (NoSchedule and NoExecute; PreferNoSchedule is a hint).

A pod pinned to a node whose taint it does not tolerate would never be scheduled there.
Matching follows the scheduler: ``Exists`` ignores the value (and with no key matches every
taint), ``Equal`` (the default) needs key and value; an empty effect matches every effect.

The pod's tolerations are indexed once (by key, and by key and value), so each taint is
checked in constant time: the work is the tolerations plus the taints, not their product.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from webhook.rules import pod as podlib

BLOCKING_EFFECTS: Final = ("NoSchedule", "NoExecute")
_ANY_EFFECT: Final = ""


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class _Tolerations:
    """Effects tolerated (``""`` = every effect): by every key, by key, by (key, value)."""

    everything: frozenset[str]
    by_key: Mapping[str, frozenset[str]]
    by_pair: Mapping[tuple[str, str], frozenset[str]]

    def tolerate(self, taint: Taint) -> bool:
        return any(
            _ANY_EFFECT in effects or taint.effect in effects
            for effects in (
                self.everything,
                self.by_key.get(taint.key, frozenset()),
                self.by_pair.get((taint.key, taint.value), frozenset()),
            )
        )


def gpu_node_toleration(key: str) -> dict[str, str]:
    """The toleration fracgpu writes on every GPU pod it admits when GPU nodes carry the
    taint ``key`` (setting ``gpu-node-taint``): any value, effect NoSchedule."""
    return {"key": key, "operator": "Exists", "effect": "NoSchedule"}


def with_toleration(pod: Mapping[str, Any], toleration: Mapping[str, str]) -> Mapping[str, Any]:
    """``pod`` as it will be once ``toleration`` is written (shared, not copied), for the
    checks that read its tolerations before the patch is applied."""
    spec = podlib.spec(pod)
    items = spec.get("tolerations") or []
    if not isinstance(items, list) or toleration in items:
        return pod  # a malformed list is reported by whoever reads it
    return {**pod, "spec": {**spec, "tolerations": [*items, toleration]}}


def tolerates_key(pod: Mapping[str, Any], key: str) -> bool:
    """Whether any of the pod's tolerations can match a taint named ``key``, whatever its
    value and effect: one naming the key, or ``Exists`` without a key (every taint)."""
    tolerations = _tolerations(pod)
    return (
        bool(tolerations.everything)
        or key in tolerations.by_key
        or any(pair_key == key for pair_key, _ in tolerations.by_pair)
    )


def untolerated_nodes(
    pod: Mapping[str, Any], node_taints: Mapping[str, Sequence[Taint]]
) -> set[str]:
    """Nodes with a blocking taint the pod does not tolerate (untainted nodes never are)."""
    return set(untolerated_taints(pod, node_taints))


def untolerated_taints(
    pod: Mapping[str, Any], node_taints: Mapping[str, Sequence[Taint]]
) -> dict[str, list[Taint]]:
    """Per node with a blocking taint the pod does not tolerate: those taints (for the
    denial's words too, from the same one index of the pod's tolerations)."""
    blocking = {
        node: [t for t in taints if t.effect in BLOCKING_EFFECTS]
        for node, taints in node_taints.items()
    }
    if not any(blocking.values()):
        return {}
    tolerations = _tolerations(pod)
    kept_off = {
        node: [taint for taint in taints if not tolerations.tolerate(taint)]
        for node, taints in blocking.items()
    }
    return {node: taints for node, taints in kept_off.items() if taints}


def _tolerations(pod: Mapping[str, Any]) -> _Tolerations:
    items = podlib.spec(pod).get("tolerations") or []
    if not isinstance(items, list) or not all(isinstance(t, Mapping) for t in items):
        raise podlib.PodShapeError(".spec.tolerations", "must be a list of objects")
    everything: set[str] = set()
    by_key: dict[str, set[str]] = {}
    by_pair: dict[tuple[str, str], set[str]] = {}
    for index, toleration in enumerate(items):
        key, value, effect, operator = (
            _string(toleration, member, index) for member in ("key", "value", "effect", "operator")
        )
        if operator == "Exists":
            (by_key.setdefault(key, set()) if key else everything).add(effect)
        else:
            by_pair.setdefault((key, value), set()).add(effect)
    return _Tolerations(
        frozenset(everything),
        {k: frozenset(v) for k, v in by_key.items()},
        {k: frozenset(v) for k, v in by_pair.items()},
    )


def _string(toleration: Mapping[str, Any], member: str, index: int) -> str:
    value = toleration.get(member)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise podlib.PodShapeError(f".spec.tolerations[{index}].{member}", "must be a string")
    return value
