"""The certs command line: its flags, the environment behind them, and the Settings they make.

Each flag `--some-flag` may also come from the environment variable `FRACGPU_CERTS_SOME_FLAG`;
a flag on the command line wins, and a value that cannot be used is refused naming the one of
the two that gave it. An on/off flag is true alone, or takes true/false (`--in-cluster false`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from fracgpu import __version__
from fracgpu.switches import switch_value

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
    """The environment variable behind flag `--name`."""
    return ENV_PREFIX + name.upper().replace("-", "_")


def _flag(parser: argparse.ArgumentParser, name: str, help_text: str) -> None:
    # argparse formats help with %: a literal one (30%) must be doubled.
    parser.add_argument(f"--{name}", help=f"{help_text} (env {_variable(name)})".replace("%", "%%"))


def _switch(
    parser: argparse.ArgumentParser, name: str, help_text: str, *, variable: bool = True
) -> None:
    """One place for an on/off flag: alone it means true, or it takes true/false (read by
    ``_boolean`` with the variable behind it)."""
    env_note = f" (env {_variable(name)})" if variable else ""
    parser.add_argument(
        f"--{name}",
        nargs="?",
        const="true",
        metavar="true|false",
        help=f"{help_text}; true or false, the flag alone means true{env_note}",
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line; the variables behind its flags are read by ``parse_command_line``."""
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
        _flag(common, name, help_text)
    _switch(common, "in-cluster", "use the Pod's service account")
    _switch(
        common,
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
    _switch(
        files,
        "projected",
        "lay the files out like a Kubernetes Secret volume (..data symlink swap)",
        variable=False,
    )
    return parser


def _boolean(source: str, text: str) -> bool:
    """An on/off value from ``source`` (a flag or its variable)."""
    # "" as false: a variable set but left empty.
    value = switch_value(text.strip()) if text.strip() else False
    if value is None:
        raise SettingsError(
            f"{source}={text!r} is not a boolean: allowed are true/false, 1/0, yes/no "
            "(a flag alone means true)"
        )
    return value


def _list(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    return tuple(item.strip() for item in text.split(",") if item.strip())


def parse_command_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Command:
    """The command and its Settings; SettingsError with the reason on a bad value, naming the
    flag or the variable that gave it."""
    env = os.environ if env is None else env
    args = build_parser().parse_args(list(argv))
    defaults = Settings()

    def given(name: str) -> tuple[str, str] | None:
        """(source, text) of setting ``name``: its flag if given, else its variable if set."""
        value: str | None = getattr(args, name)
        flag = name.replace("_", "-")
        if value is not None:
            return f"--{flag}", value
        if _variable(flag) in env:
            return _variable(flag), env[_variable(flag)]
        return None

    def text(name: str, default: str) -> str:
        found = given(name)
        return default if found is None else found[1].strip()

    def duration(name: str, default: timedelta) -> timedelta:
        found = given(name)
        return default if found is None else parse_duration(found[1], found[0])

    def window(name: str, default: Window) -> Window:
        found = given(name)
        return default if found is None else Window.parse(found[1], found[0])

    def switch(name: str) -> bool | None:
        found = given(name)
        # An empty variable is no setting (as a manifest's `value: ""` means).
        return None if found is None or not found[1].strip() else _boolean(*found)

    kubeconfig = given("kubeconfig")
    kubeconfig_path = Path(kubeconfig[1]) if kubeconfig and kubeconfig[1] else None
    in_cluster = switch("in_cluster")
    if in_cluster is None:
        # Inside a Pod without an explicit kubeconfig, the service account is the only choice.
        in_cluster = kubeconfig_path is None and bool(env.get("KUBERNETES_SERVICE_HOST"))
    cert_manager = bool(switch("cert_manager"))
    uses_kubeconfig = args.command in ("ensure", "run") and not (in_cluster or cert_manager)
    if kubeconfig is not None and kubeconfig_path is not None and uses_kubeconfig:
        _check_kubeconfig(*kubeconfig)
    settings = Settings(
        namespace=text("namespace", defaults.namespace),
        service=text("service", defaults.service),
        secret=text("secret", defaults.secret),
        ca_secret=text("ca_secret", defaults.ca_secret),
        mutating_webhook=text("mutating_webhook", defaults.mutating_webhook),
        validating_webhook=text("validating_webhook", defaults.validating_webhook),
        cluster_domain=text("cluster_domain", defaults.cluster_domain),
        extra_dns_names=_list(text("extra_dns_names", "")),
        extra_ip_addresses=_list(text("extra_ip_addresses", "")),
        serving_validity=duration("serving_validity", defaults.serving_validity),
        serving_renew_before=window("serving_renew_before", defaults.serving_renew_before),
        ca_validity=duration("ca_validity", defaults.ca_validity),
        ca_renew_before=window("ca_renew_before", defaults.ca_renew_before),
        ca_overlap=duration("ca_overlap", defaults.ca_overlap),
        interval=duration("interval", defaults.interval),
        retry_interval=duration("retry_interval", defaults.retry_interval),
        kubeconfig=kubeconfig_path,
        in_cluster=in_cluster,
        cert_manager=cert_manager,
    )
    projected: str | None = getattr(args, "projected", None)
    return Command(
        name=args.command,
        settings=settings,
        directory=getattr(args, "dir", None),
        projected=projected is not None and _boolean("--projected", projected),
    )


def _check_kubeconfig(source: str, path: str) -> None:
    """The kubeconfig must exist when the command starts; the message names its source."""
    found = Path(path)
    if not found.is_file():
        what = "it is not a file" if found.exists() else "the file does not exist"
        raise SettingsError(
            f"{source}={path!r} is not allowed: {what}; give the path of a kubeconfig file, "
            "or --in-cluster inside a Pod"
        )
