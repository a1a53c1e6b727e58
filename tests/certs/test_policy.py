"""The renewal policy with a controlled clock: what to do for each stored state."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from certs import authority
from certs.durations import Window
from certs.policy import Action, StoredState, carry_out, decide, next_due
from certs.settings import Settings

YEAR = timedelta(days=365)


def _fresh(settings: Settings, now: datetime) -> StoredState:
    """What the first run stores."""
    empty = StoredState(ca=None, serving=None)
    return carry_out(decide(empty, settings, now), empty, settings, now)


def _prints(state: StoredState) -> list[str]:
    return [authority.fingerprint(cert) for cert in state.bundle]


def test_nothing_stored_creates_ca_and_serving_certificate(
    settings: Settings, t0: datetime
) -> None:
    decision = decide(StoredState(ca=None, serving=None), settings, t0)
    assert decision.actions == {Action.CREATE_CA, Action.RENEW_SERVING}
    assert "no CA is stored" in decision.reasons
    state = carry_out(decision, StoredState(ca=None, serving=None), settings, t0)
    assert state.ca is not None and state.serving is not None
    assert authority.is_signed_by(state.serving.cert, state.ca.cert)
    assert authority.dns_names(state.serving.cert) == set(settings.dns_names)
    assert state.bundle == (state.ca.cert,)


@pytest.mark.parametrize(
    "later",
    [timedelta(0), timedelta(days=1), 0.69 * YEAR],
    ids=["just-issued", "a-day-later", "just-before-the-window"],
)
def test_a_fresh_state_needs_nothing(settings: Settings, t0: datetime, later: timedelta) -> None:
    state = _fresh(settings, t0)
    decision = decide(state, settings, t0 + later)
    assert decision.nothing_to_do, decision.summary()
    assert decision.summary() == "nothing to do"


@pytest.mark.parametrize(
    ("later", "reason"),
    [(0.71 * YEAR, "within serving-renew-before=30%"), (YEAR + timedelta(days=1), "expired at")],
    ids=["near-expiry", "expired"],
)
def test_serving_certificate_near_or_past_expiry_is_renewed_by_the_same_ca(
    settings: Settings, t0: datetime, later: timedelta, reason: str
) -> None:
    state = _fresh(settings, t0)
    now = t0 + later
    decision = decide(state, settings, now)
    assert decision.actions == {Action.RENEW_SERVING}
    assert any(reason in r for r in decision.reasons), decision.reasons
    renewed = carry_out(decision, state, settings, now)
    assert renewed.ca is state.ca
    assert renewed.serving is not None and renewed.serving.cert != state.serving.cert  # type: ignore[union-attr]
    assert renewed.serving.cert.not_valid_after_utc == now + settings.serving_validity
    assert _prints(renewed) == _prints(state)
    assert decide(renewed, settings, now).nothing_to_do


def test_a_fixed_renewal_window_counts_back_from_expiry(t0: datetime) -> None:
    settings = Settings(serving_renew_before=Window(span=timedelta(days=30)))
    state = _fresh(settings, t0)
    assert decide(state, settings, t0 + timedelta(days=334)).nothing_to_do
    assert decide(state, settings, t0 + timedelta(days=336)).actions == {Action.RENEW_SERVING}


def test_wrong_sans_are_renewed_and_the_reason_names_them(settings: Settings, t0: datetime) -> None:
    state = _fresh(settings, t0)
    moved = replace(settings, namespace="gpu-new")
    decision = decide(state, moved, t0)
    assert decision.actions == {Action.RENEW_SERVING}
    (reason,) = decision.reasons
    assert "DNS names are wrong" in reason
    assert "fracgpu-webhook.gpu-new.svc" in reason and "fracgpu-webhook.gpu-system" in reason
    renewed = carry_out(decision, state, moved, t0)
    assert renewed.serving is not None
    assert authority.dns_names(renewed.serving.cert) == set(moved.dns_names)


def test_a_new_extra_ip_address_is_renewed(settings: Settings, t0: datetime) -> None:
    state = _fresh(settings, t0)
    decision = decide(state, replace(settings, extra_ip_addresses=("10.0.0.1",)), t0)
    assert decision.actions == {Action.RENEW_SERVING}


def test_a_serving_certificate_from_another_ca_is_replaced(
    settings: Settings, t0: datetime
) -> None:
    state = _fresh(settings, t0)
    stranger = authority.new_ca(t0, YEAR)
    foreign = authority.issue_serving(stranger, settings.dns_names, t0, YEAR)
    decision = decide(replace(state, serving=foreign), settings, t0)
    assert decision.actions == {Action.RENEW_SERVING}
    assert decision.reasons == ("the serving certificate was not issued by the current CA",)


def test_ca_near_expiry_rotates_and_the_bundle_holds_both_cas(
    settings: Settings, t0: datetime
) -> None:
    state = _fresh(settings, t0)
    assert state.ca is not None
    old_ca = state.ca.cert
    rotate_at = t0 + 0.71 * settings.ca_validity
    assert decide(state, settings, t0 + 0.69 * settings.ca_validity).actions == {
        Action.RENEW_SERVING  # the serving cert expired long ago; the CA is not yet due
    }
    decision = decide(state, settings, rotate_at)
    assert decision.actions == {Action.ROTATE_CA, Action.RENEW_SERVING}
    assert any("within ca-renew-before=30%" in r for r in decision.reasons)
    rotated = carry_out(decision, state, settings, rotate_at)
    assert rotated.ca is not None and rotated.serving is not None
    assert rotated.ca.cert != old_ca
    assert authority.is_signed_by(rotated.serving.cert, rotated.ca.cert)
    # New CA first, old CA kept: webhook replicas still serving the old cert stay trusted.
    assert rotated.bundle == (rotated.ca.cert, old_ca)

    # During the overlap nothing changes.
    during = rotate_at + settings.ca_overlap - timedelta(minutes=1)
    assert decide(rotated, settings, during).nothing_to_do
    assert next_due(rotated, settings) == rotate_at + settings.ca_overlap

    # Once the new serving certificate has been in place for the overlap, the old CA goes.
    after = rotate_at + settings.ca_overlap
    drop = decide(rotated, settings, after)
    assert drop.actions == {Action.UPDATE_BUNDLE}
    assert drop.reasons == ("drop 1 replaced or expired CA(s) from the caBundle",)
    final = carry_out(drop, rotated, settings, after)
    assert final.ca is rotated.ca and final.serving is rotated.serving
    assert final.bundle == (rotated.ca.cert,)
    assert decide(final, settings, after).nothing_to_do


def test_a_serving_renewal_during_the_overlap_restarts_it(t0: datetime) -> None:
    settings = Settings(ca_overlap=timedelta(hours=2))
    state = _fresh(settings, t0)
    rotate_at = t0 + 0.71 * settings.ca_validity
    rotated = carry_out(decide(state, settings, rotate_at), state, settings, rotate_at)
    moved = replace(settings, cluster_domain="corp.example")
    later = rotate_at + timedelta(hours=1)
    decision = decide(rotated, moved, later)
    assert decision.actions == {Action.RENEW_SERVING}
    renewed = carry_out(decision, rotated, moved, later)
    assert len(renewed.bundle) == 2
    assert decide(renewed, moved, later + timedelta(hours=1, minutes=59)).nothing_to_do
    assert decide(renewed, moved, later + timedelta(hours=2)).actions == {Action.UPDATE_BUNDLE}


def test_an_expired_ca_is_replaced_and_not_kept_in_the_bundle(
    settings: Settings, t0: datetime
) -> None:
    state = _fresh(settings, t0)
    now = t0 + settings.ca_validity + timedelta(seconds=1)
    decision = decide(state, settings, now)
    assert decision.actions == {Action.CREATE_CA, Action.RENEW_SERVING}
    assert any("the CA expired at" in r for r in decision.reasons)
    assert decision.keep_in_bundle == ()
    fresh = carry_out(decision, state, settings, now)
    assert fresh.ca is not None and fresh.bundle == (fresh.ca.cert,)


def test_a_lost_ca_secret_keeps_the_old_ca_trusted_during_the_overlap(
    settings: Settings, t0: datetime
) -> None:
    """The CA Secret was deleted, but the webhooks still trust the old CA and replicas
    still serve its certificate: the new bundle keeps the old CA until the overlap ends."""
    state = _fresh(settings, t0)
    assert state.ca is not None
    lost = replace(state, ca=None, problems=("Secret gpu-system/ca: unreadable (it is replaced)",))
    decision = decide(lost, settings, t0 + timedelta(days=1))
    assert decision.actions == {Action.CREATE_CA, Action.RENEW_SERVING}
    assert decision.reasons[0].startswith("Secret gpu-system/ca: unreadable")
    assert decision.keep_in_bundle == (state.ca.cert,)


def test_a_bundle_missing_the_current_ca_is_repaired(settings: Settings, t0: datetime) -> None:
    state = _fresh(settings, t0)
    decision = decide(replace(state, bundle=()), settings, t0)
    assert decision.actions == {Action.UPDATE_BUNDLE}
    assert decision.reasons == ("add 1 CA(s) to the caBundle",)


def test_expired_and_duplicate_bundle_entries_are_dropped(settings: Settings, t0: datetime) -> None:
    state = _fresh(settings, t0)
    assert state.ca is not None
    expired = authority.new_ca(t0 - timedelta(days=20), timedelta(days=10))
    messy = replace(state, bundle=(state.ca.cert, expired.cert, state.ca.cert))
    decision = decide(messy, settings, t0)
    assert decision.actions == {Action.UPDATE_BUNDLE}
    assert carry_out(decision, messy, settings, t0).bundle == (state.ca.cert,)


def test_next_due_is_the_serving_renewal_when_nothing_else_is_pending(
    settings: Settings, t0: datetime
) -> None:
    state = _fresh(settings, t0)
    assert state.serving is not None
    expected = state.serving.cert.not_valid_after_utc - 0.3 * authority.lifetime(state.serving.cert)
    assert next_due(state, settings) == expected
    assert next_due(StoredState(ca=None, serving=None), settings) is None


@pytest.mark.parametrize(
    "settings",
    [
        Settings(),
        Settings(serving_validity=timedelta(days=1), ca_validity=timedelta(days=2)),
        Settings(
            serving_validity=timedelta(days=90),
            serving_renew_before=Window(span=timedelta(days=30)),
            ca_validity=timedelta(days=100),
            ca_renew_before=Window(span=timedelta(days=31)),
        ),
    ],
    ids=["defaults", "short-lived", "fixed-windows"],
)
def test_every_state_written_needs_nothing_right_after(settings: Settings, t0: datetime) -> None:
    """Idempotence at the policy level, for each lifetime shape (including clamping)."""
    state = _fresh(settings, t0)
    assert decide(state, settings, t0).nothing_to_do
    due = next_due(state, settings)
    assert due is not None and due > t0
    assert not decide(state, settings, due).nothing_to_do
    renewed = carry_out(decide(state, settings, due), state, settings, due)
    assert decide(renewed, settings, due).nothing_to_do
