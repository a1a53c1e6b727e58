"""The nesting limit of a review body: values at depth 64 pass, one level deeper is refused."""

import json

import pytest

from webhook.review import MAX_NESTING, MalformedReviewError, parse_review


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
