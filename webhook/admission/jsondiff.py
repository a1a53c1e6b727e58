"""A JSONPatch (RFC 6902) that turns one JSON document into another, computed by comparing them.

Objects are compared member by member and arrays item by item at the same index (items past
the shorter array are added or removed at its end), so the patch is computed in one pass
without the item matching a general-purpose differ does: fracgpu's mutation never moves
array items, and that matching was most of the cost of an admission. Values in the
operations are the target document's own objects, not copies.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Final

Operation = dict[str, Any]
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})
# A member's value when the source has none (None is a JSON value).
_ABSENT: Final = object()


def diff(source: Any, target: Any, path: str = "") -> list[Operation]:
    """Operations that, applied in order to ``source``, give ``target``; with ``path``, to
    the document that holds ``source`` at that JSON pointer."""
    ops: list[Operation] = []
    _diff(source, target, path, ops)
    return ops


def _diff(source: Any, target: Any, path: str, ops: list[Operation]) -> None:
    # Exact type tests first (pods are plain dicts, lists and scalars), the ABC checks after.
    source_type, target_type = type(source), type(target)
    if source_type is dict and target_type is dict:
        _diff_objects(source, target, path, ops)
    elif source_type in _SCALARS or target_type in _SCALARS:
        if source_type is not target_type or source != target:
            ops.append({"op": "replace", "path": path, "value": target})
    elif _is_object(source) and _is_object(target):
        _diff_objects(source, target, path, ops)
    elif _is_array(source) and _is_array(target):
        shared = min(len(source), len(target))
        for index in range(shared):
            _diff(source[index], target[index], f"{path}/{index}", ops)
        for index in range(shared, len(target)):
            ops.append({"op": "add", "path": f"{path}/{index}", "value": target[index]})
        # Each removal at the new end shifts the next surplus item into that index.
        ops.extend(
            {"op": "remove", "path": f"{path}/{shared}"} for _ in range(len(source) - shared)
        )
    elif not _same(source, target):
        ops.append({"op": "replace", "path": path, "value": target})


def _diff_objects(
    source: Mapping[str, Any], target: Mapping[str, Any], path: str, ops: list[Operation]
) -> None:
    if not source.keys() <= target.keys():
        for key in source:
            if key not in target:
                ops.append({"op": "remove", "path": _join(path, key)})
    for key, value in target.items():
        old = source.get(key, _ABSENT)
        if old is _ABSENT:
            ops.append({"op": "add", "path": _join(path, key), "value": value})
        elif old is value:
            continue  # the same object: nothing to compare
        elif type(old) is str and type(value) is str:  # most members: no call for them
            if old != value:
                ops.append({"op": "replace", "path": _join(path, key), "value": value})
        elif type(old) is dict and type(value) is dict:  # nested objects: straight down
            _diff_objects(old, value, _join(path, key), ops)
        else:
            _diff(old, value, _join(path, key), ops)


def _same(a: Any, b: Any) -> bool:
    """JSON equality of values that are not both objects or both arrays: the same type too,
    because Python's 1 == True and 1 == 1.0 are different JSON."""
    return type(a) is type(b) and a == b


def _is_object(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)


def _is_array(value: Any) -> bool:
    return type(value) is list or (
        isinstance(value, Sequence) and not isinstance(value, str | bytes)
    )


def _join(path: str, key: Any) -> str:
    """``path`` plus one member name, escaped as a JSON Pointer token (RFC 6901)."""
    token = str(key)
    if "~" in token or "/" in token:  # rare in pods: escape only when needed
        token = token.replace("~", "~0").replace("/", "~1")
    return f"{path}/{token}"
