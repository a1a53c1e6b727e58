"""webhook.jsondiff: the patch it computes, applied by an independent RFC 6902 implementation,
turns the source document into the target."""

import copy
import json
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.jsondiff import diff

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


@settings(max_examples=400, deadline=None)
@given(source=JSON, target=JSON)
def test_applying_the_diff_gives_the_target(source: Any, target: Any) -> None:
    before = copy.deepcopy(source)
    ops = diff({"doc": source}, {"doc": target})
    assert source == before  # the source is not changed
    result = jsonpatch.apply_patch({"doc": source}, ops)["doc"]
    # compared as JSON text: Python's 1 == True == 1.0 would hide a missed type change
    assert json.dumps(result, sort_keys=True) == json.dumps(target, sort_keys=True)
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
