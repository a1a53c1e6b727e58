"""Every setting of the certs component, as one value checked on construction.

The command line and environment that fill it are read in `commandline.py`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from .authority import service_dns_names, validate_dns_name
from .durations import Window, format_duration
from .errors import CertificateError, SettingsError


@dataclass(frozen=True)
class Settings:
    """What the certs component manages and how; validated on construction."""

    namespace: str = "fracgpu-system"
    service: str = "fracgpu-webhook"
    secret: str = "fracgpu-webhook-tls"
    ca_secret: str = "fracgpu-webhook-ca"
    # Empty string: that kind of webhook configuration is not managed.
    mutating_webhook: str = "fracgpu-mutating"
    validating_webhook: str = "fracgpu-validating"
    cluster_domain: str = "cluster.local"
    extra_dns_names: tuple[str, ...] = ()
    extra_ip_addresses: tuple[str, ...] = ()
    serving_validity: timedelta = timedelta(days=365)
    serving_renew_before: Window = field(default_factory=lambda: Window(fraction=0.3))
    ca_validity: timedelta = timedelta(days=3650)
    ca_renew_before: Window = field(default_factory=lambda: Window(fraction=0.3))
    # How long an old CA stays in the caBundle after the serving certificate of the new CA
    # was written: covers the kubelet's Secret volume refresh and the webhook's reload.
    ca_overlap: timedelta = timedelta(hours=1)
    interval: timedelta = timedelta(hours=1)
    retry_interval: timedelta = timedelta(minutes=1)
    kubeconfig: Path | None = None
    # Use the Pod's service account; otherwise `kubeconfig` or the default kubeconfig.
    in_cluster: bool = False
    cert_manager: bool = False

    def __post_init__(self) -> None:
        for what, name in (
            ("namespace", self.namespace),
            ("service", self.service),
            ("secret", self.secret),
            ("ca-secret", self.ca_secret),
        ):
            _check_name(what, name)
        for what, name in (
            ("mutating-webhook", self.mutating_webhook),
            ("validating-webhook", self.validating_webhook),
        ):
            if name:
                _check_name(what, name)
        if self.secret == self.ca_secret:
            raise SettingsError(
                f"secret and ca-secret are both {self.secret!r}: the CA key must live in its "
                "own Secret so that pods mounting the serving Secret never see it"
            )
        _check_name("cluster-domain", self.cluster_domain)
        for name in self.extra_dns_names:
            _check_name("extra-dns-names", name)
        for address in self.extra_ip_addresses:
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise SettingsError(
                    f"extra-ip-addresses: {address!r} is not an IPv4 or IPv6 address"
                ) from None
        for what, span in (
            ("serving-validity", self.serving_validity),
            ("ca-validity", self.ca_validity),
            ("interval", self.interval),
            ("retry-interval", self.retry_interval),
        ):
            if span <= timedelta(0):
                raise SettingsError(f"{what}={span} is not allowed: it must be positive")
        if self.ca_overlap < timedelta(0):
            raise SettingsError(f"ca-overlap={self.ca_overlap} must not be negative")
        if self.serving_validity > self.ca_validity:
            raise SettingsError(
                f"serving-validity ({format_duration(self.serving_validity)}) is longer than "
                f"ca-validity ({format_duration(self.ca_validity)}): it must not be"
            )
        self._check_windows()

    def _check_windows(self) -> None:
        serving = self.serving_renew_before.before_expiry(self.serving_validity)
        ca = self.ca_renew_before.before_expiry(self.ca_validity)
        if serving >= self.serving_validity:
            raise SettingsError(
                f"serving-renew-before={self.serving_renew_before} is not shorter than "
                f"serving-validity={format_duration(self.serving_validity)}: every run would "
                "renew the certificate"
            )
        if ca >= self.ca_validity:
            raise SettingsError(
                f"ca-renew-before={self.ca_renew_before} is not shorter than "
                f"ca-validity={format_duration(self.ca_validity)}: every run would rotate the CA"
            )
        # A serving certificate is clamped to its CA's end; with a shorter serving window than
        # the CA window, a freshly issued one is never already due.
        if serving >= ca:
            raise SettingsError(
                f"serving-renew-before ({format_duration(serving)}) must be shorter than "
                f"ca-renew-before ({format_duration(ca)})"
            )

    @property
    def dns_names(self) -> tuple[str, ...]:
        """Every DNS name the serving certificate must carry, in order."""
        names = service_dns_names(self.service, self.namespace, self.cluster_domain)
        return names + tuple(n for n in self.extra_dns_names if n not in names)

    @property
    def webhook_configurations(self) -> tuple[tuple[str, str], ...]:
        """(kind, name) of every managed webhook configuration."""
        pairs = (
            ("MutatingWebhookConfiguration", self.mutating_webhook),
            ("ValidatingWebhookConfiguration", self.validating_webhook),
        )
        return tuple((kind, name) for kind, name in pairs if name)


def _check_name(what: str, name: str) -> None:
    try:
        validate_dns_name(name)
    except CertificateError as error:
        raise SettingsError(f"{what}: {error}") from None
