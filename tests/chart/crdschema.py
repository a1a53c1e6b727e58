"""Check an object against the chart's CRD schema without an API server.

The CRDs' ``openAPIV3Schema`` is read as a JSON Schema (draft 4: ``exclusiveMinimum`` is a
boolean there, as in OpenAPI v3.0). Two differences from kube-apiserver are deliberate:
``x-kubernetes-*`` keys are dropped, and every object that lists its properties rejects
other keys. The apiserver would silently prune those instead, which is exactly the mistake
(a misspelt ``memoryscaling``) these checks are for. The end-to-end tests hold the real
apiserver to the same files.
"""

from __future__ import annotations

from typing import Any

import jsonschema

from tests.chart import chartfiles


def schemas() -> dict[str, dict[str, Any]]:
    """kind -> JSON Schema of its served version."""
    found = {}
    for crd in chartfiles.crds():
        (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
        found[crd["spec"]["names"]["kind"]] = _strict(version["schema"]["openAPIV3Schema"])
    return found


def problems(document: dict[str, Any]) -> list[str]:
    """What the CRD schema of the document's kind rejects (empty when it fits)."""
    schema = schemas()[document["kind"]]
    validator = jsonschema.Draft4Validator(schema)
    return [
        f"{'.'.join(map(str, error.path)) or '<object>'}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {k: _strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("type") == "object" and "properties" in node:
        converted.setdefault("additionalProperties", False)
    return converted
