"""The four answers admission gives: allowed, patched, denied, errored (each with warnings).

A ``Verdict`` is what the rules decide; ``to_review`` turns it into the wire format.
"""

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import orjson

from webhook.admission.review import (
    API_VERSION,
    KIND,
    AdmissionResponseBody,
    AdmissionReviewResponse,
)

# Kubernetes shows warnings to kubectl users; it truncates long ones, so do we, predictably.
MAX_WARNING_CHARS: Final = 512
MAX_WARNINGS: Final = 16


class Outcome(StrEnum):
    ALLOWED = "allowed"
    PATCHED = "patched"
    DENIED = "denied"
    ERRORED = "errored"


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    message: str = ""
    code: int = 200
    reason: str = ""
    patch: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.outcome in (Outcome.ALLOWED, Outcome.PATCHED)


def allowed(warnings: Sequence[str] = ()) -> Verdict:
    return Verdict(Outcome.ALLOWED, warnings=tuple(warnings))


def patched(patch: Sequence[dict[str, Any]], warnings: Sequence[str] = ()) -> Verdict:
    """Allowed with a JSONPatch; an empty patch is a plain allow."""
    if not patch:
        return allowed(warnings)
    return Verdict(Outcome.PATCHED, patch=tuple(patch), warnings=tuple(warnings))


def denied(
    message: str, code: int = 403, reason: str = "Forbidden", warnings: Sequence[str] = ()
) -> Verdict:
    return Verdict(Outcome.DENIED, message, code, reason, warnings=tuple(warnings))


def invalid(message: str, warnings: Sequence[str] = ()) -> Verdict:
    """Denied because the pod breaks a rule of the request format (HTTP-style 422)."""
    return denied(message, 422, "Invalid", warnings)


def errored(message: str, code: int = 500) -> Verdict:
    """The webhook itself failed (a bug, or its cluster state is unavailable): fail closed."""
    return Verdict(Outcome.ERRORED, message, code, "InternalError")


def to_review(uid: str, verdict: Verdict) -> AdmissionReviewResponse:
    body: AdmissionResponseBody = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        body["status"] = {
            "code": verdict.code,
            "message": verdict.message,
            "reason": verdict.reason,
        }
    if verdict.patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(orjson.dumps(list(verdict.patch))).decode()
    if verdict.warnings:
        body["warnings"] = [_clip(w) for w in verdict.warnings[:MAX_WARNINGS]]
    return {"apiVersion": API_VERSION, "kind": KIND, "response": body}


def _clip(text: str) -> str:
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 3] + "..."
