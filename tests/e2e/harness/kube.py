"""Small typing bridges to the kubernetes client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def body(document: Mapping[str, Any]) -> Any:
    """A plain JSON-shaped request body.

    The client sends dicts as they are (faithful for CRD schemas, which its models would
    reshape), but its signatures name model classes only: hand it the dict untyped.
    """
    return dict(document)


def as_dict(response: object) -> dict[str, Any]:
    """A CustomObjectsApi response (typed `object`) as the JSON dict it is."""
    if not isinstance(response, dict):
        raise TypeError(f"expected a JSON object from the API, got {type(response).__name__}")
    return response
