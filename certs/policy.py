"""What to do, given what is stored: nothing, renew the serving certificate, or rotate the CA.

`decide` is pure and deterministic (no key generation); `carry_out` turns a decision into
the state to store (generating keys). The trust bundle (`ca.crt` and every webhook's
caBundle) is always the current CA first, followed by replaced CAs that are still needed:
a replaced CA stays until the serving certificate of the current CA has been in place for
`ca_overlap`, so a webhook replica still serving the previous certificate is trusted until
it has reloaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from cryptography import x509

from . import authority
from .authority import CertKeyPair
from .settings import Settings


@dataclass(frozen=True)
class StoredState:
    """What is stored now (or should be): CA, serving pair and trust bundle, in order."""

    ca: CertKeyPair | None
    serving: CertKeyPair | None
    bundle: tuple[x509.Certificate, ...] = ()
    # Stored data that could not be read (reported as reasons; the data is replaced).
    problems: tuple[str, ...] = ()


class Action(StrEnum):
    CREATE_CA = "create-ca"
    ROTATE_CA = "rotate-ca"
    RENEW_SERVING = "renew-serving"
    UPDATE_BUNDLE = "update-bundle"


@dataclass(frozen=True)
class Decision:
    actions: frozenset[Action]
    reasons: tuple[str, ...]
    # Replaced CAs that stay in the bundle after the current one.
    keep_in_bundle: tuple[x509.Certificate, ...] = field(default=())

    @property
    def nothing_to_do(self) -> bool:
        return not self.actions

    def summary(self) -> str:
        if self.nothing_to_do:
            return "nothing to do"
        actions = ", ".join(sorted(self.actions))
        return f"{actions}: " + "; ".join(self.reasons)


def decide(state: StoredState, settings: Settings, now: datetime) -> Decision:
    """What must change in `state` at `now`, with the reasons; no actions when all is well."""
    actions: set[Action] = set()
    reasons: list[str] = list(state.problems)

    ca_action, ca_reason = _ca_verdict(state.ca, settings, now)
    if ca_action is not None:
        actions.add(ca_action)
        reasons.append(ca_reason)
    serving_reason = (
        "the CA is replaced" if ca_action is not None else _serving_verdict(state, settings, now)
    )
    if serving_reason:
        actions.add(Action.RENEW_SERVING)
        if ca_action is None:
            reasons.append(serving_reason)

    current = state.ca.cert if ca_action is None and state.ca is not None else None
    keep = _replaced_cas_to_keep(state, current, Action.RENEW_SERVING in actions, settings, now)
    desired = _fingerprints(((current,) if current is not None else ()) + keep)
    # With a new CA the bundle changes anyway; otherwise say why it does.
    if ca_action is None and desired != _fingerprints(state.bundle):
        actions.add(Action.UPDATE_BUNDLE)
        reasons.append(_bundle_reason(state.bundle, desired))
    return Decision(actions=frozenset(actions), reasons=tuple(reasons), keep_in_bundle=keep)


def carry_out(
    decision: Decision, state: StoredState, settings: Settings, now: datetime
) -> StoredState:
    """The state to store: new keys and certificates where the decision says so."""
    ca = state.ca
    if Action.CREATE_CA in decision.actions or Action.ROTATE_CA in decision.actions:
        ca = authority.new_ca(now, settings.ca_validity)
    if ca is None:
        raise AssertionError("decide() creates a CA whenever none is stored")
    serving = state.serving
    if Action.RENEW_SERVING in decision.actions or serving is None:
        serving = authority.issue_serving(
            ca,
            settings.dns_names,
            now,
            settings.serving_validity,
            ip_addresses=settings.extra_ip_addresses,
        )
    return StoredState(ca=ca, serving=serving, bundle=(ca.cert, *decision.keep_in_bundle))


def next_due(state: StoredState, settings: Settings) -> datetime | None:
    """When `decide` will next have something to do for this (freshly written) state."""
    if state.ca is None or state.serving is None:
        return None
    times = [
        _due(
            state.ca.cert, settings.ca_renew_before.before_expiry(authority.lifetime(state.ca.cert))
        ),
        _due(
            state.serving.cert,
            settings.serving_renew_before.before_expiry(authority.lifetime(state.serving.cert)),
        ),
    ]
    if len(state.bundle) > 1:
        times.append(authority.issued_at(state.serving.cert) + settings.ca_overlap)
    return min(times)


# --- verdicts -------------------------------------------------------------------------


def _ca_verdict(
    ca: CertKeyPair | None, settings: Settings, now: datetime
) -> tuple[Action | None, str]:
    if ca is None:
        return Action.CREATE_CA, "no CA is stored"
    cert = ca.cert
    end = cert.not_valid_after_utc
    if not authority.is_ca(cert):
        return Action.CREATE_CA, "the stored CA certificate is not a CA (basicConstraints)"
    if now >= end:
        return Action.CREATE_CA, f"the CA expired at {end.isoformat()}"
    if now >= _due(cert, settings.ca_renew_before.before_expiry(authority.lifetime(cert))):
        return (
            Action.ROTATE_CA,
            f"the CA expires at {end.isoformat()}, within ca-renew-before="
            f"{settings.ca_renew_before}",
        )
    return None, ""


def _serving_verdict(state: StoredState, settings: Settings, now: datetime) -> str:
    """Why the serving certificate must be renewed, or '' when it is fine."""
    serving, ca = state.serving, state.ca
    if serving is None:
        return "no serving certificate is stored"
    assert ca is not None
    cert = serving.cert
    end = cert.not_valid_after_utc
    if not authority.is_signed_by(cert, ca.cert):
        return "the serving certificate was not issued by the current CA"
    expected = frozenset(settings.dns_names)
    names = authority.dns_names(cert)
    if names != expected:
        missing = ", ".join(sorted(expected - names)) or "-"
        extra = ", ".join(sorted(names - expected)) or "-"
        return f"the serving certificate's DNS names are wrong (missing: {missing}; extra: {extra})"
    if authority.ip_addresses(cert) != frozenset(settings.extra_ip_addresses):
        return "the serving certificate's IP addresses differ from extra-ip-addresses"
    if now >= end:
        return f"the serving certificate expired at {end.isoformat()}"
    if now < cert.not_valid_before_utc:
        return f"the serving certificate is not valid before {cert.not_valid_before_utc}"
    window = settings.serving_renew_before.before_expiry(authority.lifetime(cert))
    if now >= _due(cert, window):
        return (
            f"the serving certificate expires at {end.isoformat()}, within "
            f"serving-renew-before={settings.serving_renew_before}"
        )
    return ""


def _replaced_cas_to_keep(
    state: StoredState,
    current: x509.Certificate | None,
    serving_renewed: bool,
    settings: Settings,
    now: datetime,
) -> tuple[x509.Certificate, ...]:
    """Replaced CAs that clients may still need, in bundle order, without duplicates."""
    candidates = list(state.bundle)
    if current is None and state.ca is not None:
        candidates.append(state.ca.cert)  # the CA being replaced, even if missing from the bundle
    current_print = authority.fingerprint(current) if current is not None else None
    seen: set[str] = set()
    keep: list[x509.Certificate] = []
    for cert in candidates:
        print_ = authority.fingerprint(cert)
        if print_ == current_print or print_ in seen or now >= cert.not_valid_after_utc:
            continue
        seen.add(print_)
        keep.append(cert)
    if not keep or serving_renewed or current is None:
        return tuple(keep)
    # The serving certificate stays and is the current CA's: the overlap may be over.
    assert state.serving is not None
    if now >= authority.issued_at(state.serving.cert) + settings.ca_overlap:
        return ()
    return tuple(keep)


def _due(cert: x509.Certificate, window: timedelta) -> datetime:
    return cert.not_valid_after_utc - window


def _fingerprints(certs: Iterable[x509.Certificate]) -> tuple[str, ...]:
    return tuple(authority.fingerprint(cert) for cert in certs)


def _bundle_reason(old: tuple[x509.Certificate, ...], new: tuple[str, ...]) -> str:
    old_prints = _fingerprints(old)
    added = len([p for p in new if p not in old_prints])
    dropped = len([p for p in old_prints if p not in new])
    parts = []
    if added:
        parts.append(f"add {added} CA(s) to the caBundle")
    if dropped:
        parts.append(f"drop {dropped} replaced or expired CA(s) from the caBundle")
    if not parts:
        parts.append("reorder the caBundle (current CA first)")
    return " and ".join(parts)
