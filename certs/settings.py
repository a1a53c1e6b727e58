"""Every setting of the certs component, read from the command line (or environment) here only.

Each flag `--some-flag` may also come from the environment variable `FRACGPU_CERTS_SOME_FLAG`;
a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from fracgpu import __version__

from .authority import service_dns_names, validate_dns_name
from .errors import CertificateError, SettingsError

ENV_PREFIX = "FRACGPU_CERTS_"
_DURATION_PART = re.compile(r"(\d+)(y|w|d|h|m|s)")
_UNIT = {
    "y": timedelta(days=365),
    "w": timedelta(weeks=1),
    "d": timedelta(days=1),
    "h": timedelta(hours=1),
    "m": timedelta(minutes=1),
    "s": timedelta(seconds=1),
}
_DURATION_HELP = "allowed: numbers with units y, w, d, h, m, s, e.g. 365d, 1h30m"


def parse_duration(text: str, what: str = "duration") -> timedelta:
    """`1h30m`, `365d`, `10y` (a year is 365 days) as a timedelta."""
    compact = text.strip().lower()
    if not compact or _DURATION_PART.sub("", compact):
        raise SettingsError(f"{what}={text!r} is not a duration: {_DURATION_HELP}")
    return sum((int(n) * _UNIT[unit] for n, unit in _DURATION_PART.findall(compact)), timedelta(0))


def format_duration(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


@dataclass(frozen=True)
class Window:
    """How long before expiry a certificate is replaced: a share of its lifetime or a span."""

    fraction: float | None = None
    span: timedelta | None = None

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.span is None):
            raise SettingsError("a renewal window is either a percentage or a duration, not both")
        if self.fraction is not None and not 0 < self.fraction < 1:
            raise SettingsError(
                f"renewal window {self.fraction:.0%} is not allowed: use 1%..99% of the lifetime"
            )
        if self.span is not None and self.span <= timedelta(0):
            raise SettingsError(f"renewal window {self.span} must be positive")

    @classmethod
    def parse(cls, text: str, what: str = "renewal window") -> Window:
        """`30%` (of each certificate's lifetime) or a duration such as `30d`."""
        stripped = text.strip()
        if stripped.endswith("%"):
            try:
                percent = float(stripped[:-1])
            except ValueError:
                raise SettingsError(
                    f"{what}={text!r} is not a percentage: allowed e.g. 30%"
                ) from None
            return cls(fraction=percent / 100)
        return cls(span=parse_duration(stripped, what))

    def before_expiry(self, lifetime: timedelta) -> timedelta:
        """The span before notAfter from which a certificate of this lifetime is replaced."""
        if self.fraction is not None:
            return lifetime * self.fraction
        assert self.span is not None
        return self.span

    def __str__(self) -> str:
        if self.fraction is not None:
            return f"{self.fraction * 100:g}%"
        assert self.span is not None
        return format_duration(self.span)


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


@dataclass(frozen=True)
class Command:
    """What the command line asked for."""

    name: str  # ensure | run | files
    settings: Settings
    directory: Path | None = None  # `files` only
    projected: bool = False  # `files` only


def _flag(
    parser: argparse.ArgumentParser, env: Mapping[str, str], name: str, help_text: str
) -> None:
    variable = ENV_PREFIX + name.upper().replace("-", "_")
    # argparse formats help with %: a literal one (30%) must be doubled.
    parser.add_argument(
        f"--{name}",
        default=env.get(variable),
        help=f"{help_text} (env {variable})".replace("%", "%%"),
    )


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    defaults = Settings()
    common = argparse.ArgumentParser(add_help=False)
    flags = (
        ("namespace", f"namespace of the webhook Service and Secrets [{defaults.namespace}]"),
        ("service", f"name of the webhook Service [{defaults.service}]"),
        ("secret", f"kubernetes.io/tls Secret the webhook mounts [{defaults.secret}]"),
        ("ca-secret", f"Secret holding the CA certificate and key [{defaults.ca_secret}]"),
        (
            "mutating-webhook",
            f"MutatingWebhookConfiguration name, '' for none [{defaults.mutating_webhook}]",
        ),
        (
            "validating-webhook",
            f"ValidatingWebhookConfiguration name, '' for none [{defaults.validating_webhook}]",
        ),
        ("cluster-domain", f"cluster DNS domain [{defaults.cluster_domain}]"),
        ("extra-dns-names", "comma-separated extra DNS names for the serving certificate"),
        ("extra-ip-addresses", "comma-separated IP addresses for the serving certificate"),
        ("serving-validity", "serving certificate lifetime [365d]"),
        (
            "serving-renew-before",
            "renew the serving certificate this long before expiry, "
            "a percentage of its lifetime or a duration [30%]",
        ),
        ("ca-validity", "CA lifetime [3650d]"),
        ("ca-renew-before", "rotate the CA this long before expiry [30%]"),
        (
            "ca-overlap",
            "keep a replaced CA in the caBundle this long after the new serving "
            "certificate was written [1h]",
        ),
        ("interval", "`run`: time between checks [1h]"),
        ("retry-interval", "`run`: time before retrying after an error [1m]"),
        (
            "kubeconfig",
            "kubeconfig file (default: the Pod's service account inside a Pod, "
            "else ~/.kube/config or $KUBECONFIG)",
        ),
    )
    for name, help_text in flags:
        _flag(common, env, name, help_text)
    common.add_argument(
        "--in-cluster",
        action="store_true",
        default=_env_bool(env, "IN_CLUSTER"),
        help=f"use the Pod's service account (env {ENV_PREFIX}IN_CLUSTER)",
    )
    common.add_argument(
        "--cert-manager",
        action="store_true",
        default=_env_bool(env, "CERT_MANAGER"),
        help="cert-manager issues the certificate and injects the caBundle: do nothing "
        f"(see docs/certificates.md) (env {ENV_PREFIX}CERT_MANAGER)",
    )
    parser = argparse.ArgumentParser(
        prog="fracgpu-certs",
        description="CA and serving certificate for the fracgpu webhook.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "ensure", parents=[common], help="create or renew once, then exit (Helm hook Job)"
    )
    commands.add_parser(
        "run", parents=[common], help="check every --interval until SIGTERM (controller)"
    )
    files = commands.add_parser(
        "files",
        parents=[common],
        help="issue a fresh CA and serving certificate into a directory (local use, demos)",
    )
    files.add_argument("--dir", required=True, type=Path, help="directory to write into")
    files.add_argument(
        "--projected",
        action="store_true",
        help="lay the files out like a Kubernetes Secret volume (..data symlink swap)",
    )
    return parser


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    value = env.get(ENV_PREFIX + name, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise SettingsError(
        f"{ENV_PREFIX}{name}={value!r} is not a boolean: allowed are true/false, 1/0, yes/no"
    )


def _list(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    return tuple(item.strip() for item in text.split(",") if item.strip())


def parse_command_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Command:
    """The command and its Settings; SettingsError with the reason on a bad value."""
    env = os.environ if env is None else env
    args = build_parser(env).parse_args(list(argv))
    defaults = Settings()

    def text(name: str, default: str) -> str:
        value: str | None = getattr(args, name)
        return default if value is None else value.strip()

    def duration(name: str, default: timedelta) -> timedelta:
        value: str | None = getattr(args, name)
        return default if value is None else parse_duration(value, name.replace("_", "-"))

    def window(name: str, default: Window) -> Window:
        value: str | None = getattr(args, name)
        return default if value is None else Window.parse(value, name.replace("_", "-"))

    kubeconfig: str | None = args.kubeconfig
    settings = Settings(
        namespace=text("namespace", defaults.namespace),
        service=text("service", defaults.service),
        secret=text("secret", defaults.secret),
        ca_secret=text("ca_secret", defaults.ca_secret),
        mutating_webhook=text("mutating_webhook", defaults.mutating_webhook),
        validating_webhook=text("validating_webhook", defaults.validating_webhook),
        cluster_domain=text("cluster_domain", defaults.cluster_domain),
        extra_dns_names=_list(args.extra_dns_names),
        extra_ip_addresses=_list(args.extra_ip_addresses),
        serving_validity=duration("serving_validity", defaults.serving_validity),
        serving_renew_before=window("serving_renew_before", defaults.serving_renew_before),
        ca_validity=duration("ca_validity", defaults.ca_validity),
        ca_renew_before=window("ca_renew_before", defaults.ca_renew_before),
        ca_overlap=duration("ca_overlap", defaults.ca_overlap),
        interval=duration("interval", defaults.interval),
        retry_interval=duration("retry_interval", defaults.retry_interval),
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
        # Inside a Pod without an explicit kubeconfig, the service account is the only choice.
        in_cluster=bool(args.in_cluster)
        or (not kubeconfig and bool(env.get("KUBERNETES_SERVICE_HOST"))),
        cert_manager=bool(args.cert_manager),
    )
    return Command(
        name=args.command,
        settings=settings,
        directory=getattr(args, "dir", None),
        projected=bool(getattr(args, "projected", False)),
    )
