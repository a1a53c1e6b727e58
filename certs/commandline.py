"""The certs command line: its flags, the environment behind them, and the Settings they make.

Each flag `--some-flag` may also come from the environment variable `FRACGPU_CERTS_SOME_FLAG`;
a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from fracgpu import __version__

from .durations import Window, parse_duration
from .errors import SettingsError
from .settings import Settings

ENV_PREFIX = "FRACGPU_CERTS_"


@dataclass(frozen=True)
class Command:
    """What the command line asked for."""

    name: str  # ensure | run | files
    settings: Settings
    directory: Path | None = None  # `files` only
    projected: bool = False  # `files` only


def _variable(name: str) -> str:
    """The environment variable behind flag `--name`, without ENV_PREFIX."""
    return name.upper().replace("-", "_")


def _flag(
    parser: argparse.ArgumentParser, env: Mapping[str, str], name: str, help_text: str
) -> None:
    variable = ENV_PREFIX + _variable(name)
    # argparse formats help with %: a literal one (30%) must be doubled.
    parser.add_argument(
        f"--{name}",
        default=env.get(variable),
        help=f"{help_text} (env {variable})".replace("%", "%%"),
    )


def _switch(
    parser: argparse.ArgumentParser, env: Mapping[str, str], name: str, help_text: str
) -> None:
    """One place for an on/off flag whose default comes from its environment variable."""
    variable = _variable(name)
    parser.add_argument(
        f"--{name}",
        action="store_true",
        default=_env_bool(env, variable),
        help=f"{help_text} (env {ENV_PREFIX}{variable})",
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
    _switch(common, env, "in-cluster", "use the Pod's service account")
    _switch(
        common,
        env,
        "cert-manager",
        "cert-manager issues the certificate and injects the caBundle: do nothing "
        "(see docs/certificates.md)",
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
