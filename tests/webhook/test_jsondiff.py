"""webhook.admission.jsondiff: the patch it computes, applied by an independent RFC 6902
implementation,
turns the source document into the target."""

import copy
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.admission.jsondiff import diff

KEYS = st.sampled_from(["a", "b", "c/d", "e~f", "", "fracgpu.io/assignment"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2),
    st.floats(-2, 2, allow_nan=False),
    st.text(max_size=3),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: Python's 1 == True == 1.0 would hide a missed type change
    (numbers still compare by value, so -0.0 equals 0.0 as RFC 6902 has it)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@settings(max_examples=400, deadline=None)
@given(source=JSON, target=JSON)
def test_applying_the_diff_gives_the_target(source: Any, target: Any) -> None:
    before = copy.deepcopy(source)
    ops = diff({"doc": source}, {"doc": target})
    assert source == before  # the source is not changed
    result = jsonpatch.apply_patch({"doc": source}, ops)["doc"]
    assert same_json(result, target)
    assert diff({"doc": target}, {"doc": target}) == []


def test_member_names_are_escaped_and_types_compared_as_json() -> None:
    ops = diff({"a/b": 1, "c~d": [1, 2, 3]}, {"a/b": True, "c~d": [1]})
    assert ops == [
        {"op": "replace", "path": "/a~1b", "value": True},
        {"op": "remove", "path": "/c~0d/1"},
        {"op": "remove", "path": "/c~0d/1"},
    ]


def test_new_members_and_items_are_added_in_place() -> None:
    assert diff(
        {"env": [{"name": "A"}]}, {"env": [{"name": "A", "value": "1"}, {"name": "B"}], "x": {}}
    ) == [
        {"op": "add", "path": "/env/0/value", "value": "1"},
        {"op": "add", "path": "/env/1", "value": {"name": "B"}},
        {"op": "add", "path": "/x", "value": {}},
    ]
