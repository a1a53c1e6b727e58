"""The nesting limit of a review body: values at depth 64 pass, one level deeper is refused."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.admission import review
from webhook.admission.review import MAX_NESTING, MalformedReviewError, parse_review
from webhook.rules.podbounds import PodLimits
from webhook.serving.screen import Screened, screen


def review_with_depth(levels: int, leaf: object) -> bytes:
    """A valid review whose pod annotation value nests ``levels`` arrays below the document."""
    value = leaf
    # the document, request, object and metadata hold the nested value: 4 levels
    for _ in range(levels - 5):
        value = [value]
    pod = {"metadata": {"name": "p", "annotations": {"deep": value}}}
    request = {
        "uid": "u",
        "operation": "CREATE",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "object": pod,
    }
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(body).encode()


@pytest.mark.parametrize("leaf", [1, "x", [], {}])
def test_values_at_the_limit_pass_and_deeper_ones_are_refused(leaf: object) -> None:
    parse_review(review_with_depth(MAX_NESTING, leaf), "application/json", 10**6)
    with pytest.raises(MalformedReviewError, match=f"nested deeper than {MAX_NESTING}"):
        parse_review(review_with_depth(MAX_NESTING + 1, leaf), "application/json", 10**6)


@pytest.mark.parametrize("leaf", [1, "x", [], {}])
def test_the_bracket_count_shortcut_keeps_the_limit(leaf: object) -> None:
    """Bodies with few brackets skip the walk; at the limit every bracket is a level."""
    at_limit = review_with_depth(MAX_NESTING, leaf)
    deeper = review_with_depth(MAX_NESTING + 1, leaf)
    assert not review._may_nest_deeper(b"{}" * 32, MAX_NESTING)
    assert review._may_nest_deeper(deeper, MAX_NESTING)
    parse_review(at_limit, "application/json", 10**6)
    with pytest.raises(MalformedReviewError):
        parse_review(deeper, "application/json", 10**6)


JSON = st.recursive(
    st.none() | st.integers() | st.text(alphabet="a{[]}", max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=20,
)


@given(JSON, st.integers(0, 6))
def test_the_shortcut_never_skips_a_document_that_nests_too_deep(value: object, limit: int) -> None:
    if review._depth_exceeds(value, limit):
        assert review._may_nest_deeper(json.dumps(value).encode(), limit)


@pytest.mark.parametrize("leaf", [1, "x", [], {}])
def test_the_screening_worker_keeps_the_limit(leaf: object) -> None:
    """A large review is parsed in a worker first (webhook.serving.screen), which checks the nesting
    that the loop then does not check again."""
    pad = b' "pad": "' + b"p" * 200_000 + b'",'
    at_limit = review_with_depth(MAX_NESTING, leaf).replace(b"{", b"{" + pad, 1)
    deeper = review_with_depth(MAX_NESTING + 1, leaf).replace(b"{", b"{" + pad, 1)
    limits = PodLimits()
    assert screen(at_limit, "application/json", 10**7, limits) == Screened()
    refused = screen(deeper, "application/json", 10**7, limits)
    assert refused.status == 400 and f"nested deeper than {MAX_NESTING}" in refused.message
