"""``fracgpu``: the webhook's command line.

- ``fracgpu`` / ``fracgpu demo``: run the webhook locally and send it the example pods;
- ``fracgpu admit POD.yaml --cluster CLUSTER.yaml``: print the pod as fracgpu would admit it;
- ``fracgpu serve``: serve the webhook (settings from flags or FRACGPU_* variables);
  ``fracgpu serve --check-settings`` only says whether ``serve`` would start with them.
"""

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import jsonpatch
import yaml
from aiohttp import web

from fracgpu import __version__
from fracgpu.quantity import shown
from webhook import documents, settings, workloads
from webhook.admission.decide import Admission
from webhook.admission.review import parse_review
from webhook.cli import demo
from webhook.cli.client import build_review
from webhook.cluster.apiclient import Endpoint, endpoint_from_kubeconfig
from webhook.cluster.runtime import ClusterMode, ClusterRuntime, kube_state
from webhook.metrics import Metrics
from webhook.queue.extender import Extender, loopback_app
from webhook.queue.keys import SharedKey
from webhook.serving import server
from webhook.serving.forward import LeaderForwarder
from webhook.serving.gcpause import freeze_when_ready
from webhook.serving.tls import CertificateReloader, TLSConfigError, TLSFiles
from webhook.state.backend import StateBackend
from webhook.state.clusterfile import ClusterFileError
from webhook.state.embedded import EmbeddedState

LOOPBACK = "127.0.0.1"
# Bind addresses that name no reachable address of this replica.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")

log = logging.getLogger("fracgpu")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command = args.command or "demo"
    try:
        if command == "demo":
            logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
            mode = getattr(args, "demo_placement_mode", "immediate")
            return asyncio.run(demo.run(args.cluster, args.pods, sys.stdout, mode))
        if getattr(args, "check_settings", False):
            return _check_settings(args)
        scopes = settings.ADMIT_SCOPES if command == "admit" else settings.SERVE_SCOPES
        config = settings.load(args, os.environ, scopes)
        logging.basicConfig(
            level=config.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        if command == "admit":
            return asyncio.run(_admit(args.pod, args.username, args.dry_run, config))
        return asyncio.run(_serve(config))
    except (
        settings.SettingsError,
        ClusterFileError,
        documents.DocumentError,
        TLSConfigError,
        OSError,
    ) as error:
        print(f"fracgpu: {error}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fracgpu", description="fractional GPUs for Kubernetes: the admission webhook"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command")
    run_demo = commands.add_parser("demo", help="run the webhook locally on the example pods")
    run_demo.add_argument(
        "--cluster",
        type=Path,
        default=demo.EXAMPLES / "cluster.yaml",
        help="cluster file: nodes, GPUs, placed pods, quotas [%(default)s]",
    )
    run_demo.add_argument(
        "--pods",
        type=Path,
        default=demo.EXAMPLES / "pods",
        help="directory of pod manifests (*.yaml), sent in name order [%(default)s]",
    )
    run_demo.add_argument(
        "--placement-mode",
        dest="demo_placement_mode",
        choices=("immediate", "queue"),
        default="immediate",
        help="queue: pods that do not fit now are shown QUEUED instead of denied [%(default)s]",
    )
    admit = commands.add_parser("admit", help="print a pod as fracgpu would admit it")
    admit.add_argument(
        "pod",
        type=Path,
        help="pod manifest (YAML or JSON), or a workload's, taken by its pod template: "
        + workloads.KINDS_TAKEN,
    )
    admit.add_argument(
        "--cluster",
        dest="cluster_file",
        default=None,
        help="cluster file (or FRACGPU_CLUSTER_FILE)",
    )
    admit.add_argument("--username", default="alice@example.com", help="requesting user")
    admit.add_argument("--dry-run", action="store_true", help="send the request as dry-run")
    settings.add_arguments(admit, settings.ADMIT_SCOPES)
    serve = commands.add_parser("serve", help="serve the webhook over HTTPS")
    serve.add_argument(
        "--check-settings",
        action="store_true",
        help="only check the settings as serve reads them (flags, FRACGPU_* variables): print "
        "one line, exit 0 when serve would start with them, 2 with the reason when not; "
        "opens no connection and reads neither the TLS files nor the cluster file (the "
        "chart's pre-install hook runs it)",
    )
    settings.add_arguments(serve, settings.SERVE_SCOPES)
    # `fracgpu` alone runs the demo with its defaults.
    parser.set_defaults(
        cluster=demo.EXAMPLES / "cluster.yaml", pods=demo.EXAMPLES / "pods", command=None
    )
    return parser


CHECK_PREFIX: Final = "fracgpu serve --check-settings"


def _check_settings(args: argparse.Namespace) -> int:
    """``serve --check-settings``: the settings as ``serve`` loads them, and what ``serve``
    refuses in them before it reads a file or opens a socket; one line, exit 0 or 2."""
    try:
        _servable(settings.load(args, os.environ, settings.SERVE_SCOPES))
    except settings.SettingsError as error:
        print(f"{CHECK_PREFIX}: the webhook would not start: {error}", file=sys.stderr)
        return 2
    print(f"{CHECK_PREFIX}: the settings are valid: the webhook starts with them")
    return 0


def _servable(config: settings.Settings) -> TLSFiles:
    """What ``serve`` needs of its settings alone (files and connections come later): the
    serving certificate's files, and a cluster file unless in cluster mode."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        raise settings.SettingsError(
            "serving needs --tls-cert-file and --tls-key-file (FRACGPU_TLS_CERT_FILE, "
            "FRACGPU_TLS_KEY_FILE): the API server only calls webhooks over HTTPS"
        )
    if not config.cluster_mode:
        _cluster_file(config)
    return TLSFiles(config.tls_cert_file, config.tls_key_file)


def _cluster_file(config: settings.Settings) -> Path:
    if config.cluster_file is None:
        raise settings.SettingsError(
            "no cluster state: pass --cluster-file (or --cluster for admit) or set "
            "FRACGPU_CLUSTER_FILE to a cluster file such as examples/cluster.yaml"
        )
    return config.cluster_file


def _state(config: settings.Settings) -> EmbeddedState:
    return EmbeddedState.from_file(
        _cluster_file(config),
        config.split_count,
        config.reservation_ttl_seconds,
        config.memory_scaling,
        admission_window_s=config.admission_window_seconds,
        held_whole_nodes=config.held_whole_nodes,
    )


async def _admit(pod_file: Path, username: str, dry_run: bool, config: settings.Settings) -> int:
    """Run the pod through mutate then validate in-process; print it, or the denial (exit 1).
    A workload's manifest is taken by the pod its controller would make."""
    pod, workload = workloads.load_manifest(pod_file)
    if workload is not None:
        print(f"# the pod {workload} would make", file=sys.stderr)
    scheduler = pod["spec"].get("schedulerName") if isinstance(pod.get("spec"), dict) else None
    if scheduler not in (None, "default-scheduler", config.scheduler_name):
        print(
            f"Warning: spec.schedulerName {shown(scheduler)!r} is not kube-scheduler's: the pod "
            "waits Pending until that scheduler binds it (remove it when that scheduler, "
            "e.g. hami-scheduler, is gone)",
            file=sys.stderr,
        )
    admission = Admission(config, _state(config), Metrics())
    for endpoint in ("mutate", "validate"):
        review = build_review(pod, username=username, dry_run=dry_run)
        request = parse_review(json.dumps(review).encode(), "application/json", 2**31)
        verdict = await (admission.mutate if endpoint == "mutate" else admission.validate)(request)
        for warning in verdict.warnings:
            print(f"Warning: {warning}", file=sys.stderr)
        if not verdict.allowed:
            print(f"denied by /{endpoint}: {verdict.message}", file=sys.stderr)
            return 1
        pod = jsonpatch.apply_patch(pod, list(verdict.patch))
    sys.stdout.write(yaml.safe_dump(pod, sort_keys=False))
    return 0


async def _serve(config: settings.Settings) -> int:
    files = _servable(config)
    for line in settings.describe(config):
        log.info("setting %s", line)
    for message in settings.unknown_variables(os.environ):
        log.warning("%s", message)
    reloader = CertificateReloader(files, config.tls_reload_seconds)
    if not config.cluster_mode:
        return await _serve_until_signal(config, _state(config), reloader)
    forwarder = LeaderForwarder(files.cert, config.identity)
    async with kube_state(ClusterMode.from_settings(config, _endpoint(config))) as runtime:
        return await _serve_until_signal(config, runtime.state, reloader, forwarder, runtime)


def _shared_keys(config: settings.Settings) -> tuple[SharedKey, SharedKey]:
    """(seal of queued entries, signature of relayed extender calls): every replica derives
    them from the serving key of the one TLS Secret they share."""
    return (
        SharedKey(config.tls_key_file, "fracgpu queued entry"),
        SharedKey(config.tls_key_file, "fracgpu extender relay"),
    )


async def _serve_until_signal(
    config: settings.Settings,
    state: StateBackend,
    reloader: CertificateReloader,
    forwarder: LeaderForwarder | None = None,
    runtime: ClusterRuntime | None = None,
) -> int:
    seal, relay = _shared_keys(config)
    extender = None
    if runtime is not None:
        extender = Extender(
            runtime.state, runtime.queue, relay, forwarder, max_body_bytes=config.max_body_bytes
        )
    running = await server.start(config, state, reloader, forwarder, seal=seal, extender=extender)
    log.info("serving on %s", running.url)
    loopback = None
    queueing = config.placement_mode is settings.PlacementMode.QUEUE
    if extender is not None and config.extender_port and queueing:
        # Plain HTTP on loopback only: the fracgpu scheduler runs in this pod (security.md).
        loopback = web.AppRunner(loopback_app(extender), access_log=None, handle_signals=False)
        await loopback.setup()
        await web.TCPSite(loopback, LOOPBACK, config.extender_port).start()
        log.info("scheduler extender on http://%s:%d", LOOPBACK, config.extender_port)
    if runtime is not None:
        url = config.advertise_url or ("" if config.host in WILDCARD_HOSTS else running.url)
        if not url:
            log.warning(
                "no %s: while this replica leads, the others cannot forward GPU pods to it",
                settings.option_flag("advertise_url"),
            )
        runtime.campaign(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    freezing = asyncio.create_task(freeze_when_ready(state.ready), name="gc-freeze")
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        freezing.cancel()
        if loopback is not None:
            await loopback.cleanup()
        await running.stop()
    return 0


def _endpoint(config: settings.Settings) -> Endpoint:
    """Where the API server is; a kubeconfig that cannot be used is one line, not a trace."""
    from kubernetes.config import ConfigException  # noqa: PLC0415 - cluster mode only

    if config.in_cluster:
        where, kubeconfig = "the pod's service account", None
    else:
        where, kubeconfig = f"--kubeconfig {config.kubeconfig}", str(config.kubeconfig)
        if config.kubeconfig is None or not Path(config.kubeconfig).is_file():
            raise settings.SettingsError(f"{where}: the file does not exist")
    try:
        return endpoint_from_kubeconfig(kubeconfig)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        line = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise settings.SettingsError(f"{where}: not valid YAML{line}") from None
    except (ConfigException, yaml.YAMLError, OSError) as error:
        raise settings.SettingsError(f"{where}: {' '.join(str(error).split())}") from None


if __name__ == "__main__":
    sys.exit(main())
