"""fracgpu-agent: wire the parts together, run until SIGTERM, then shut down cleanly."""

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import yaml
from kubernetes import client
from kubernetes import config as kube_config

from agent.boardfiles import BOARD_RECORD, BoardFiles
from agent.boards import BoardLoop, BoardPublisher, allocation_sources
from agent.containers import LiveContainer, live_containers, live_keys
from agent.containerstart import ContainerStarter
from agent.context_probe import measure_node
from agent.deviceplugin.plugin import DevicePlugin
from agent.deviceplugin.server import PluginManager
from agent.deviceplugin.state import DeviceState
from agent.deviceplugin.units import ResourceKind
from agent.discovery import discover
from agent.endpoint import start_http_server
from agent.health import HealthMonitor
from agent.hostfiles import AllocationFiles
from agent.housekeeping import Housekeeper
from agent.inventory import InventoryLoop, InventoryPublisher
from agent.limits import MAX_CONTEXT_OVERHEAD_BYTES
from agent.logs import setup_logging
from agent.metrics import AgentCollector, ContextOverheadCollector, build_registry
from agent.nodepods import KubernetesNodePods
from agent.nodesettings import follow_memory_scaling
from agent.nvml_backend import NvmlError, PynvmlBackend
from agent.periodic import Periodic
from agent.podlookup import KubernetesPodLookup
from agent.podresources import PodResourcesClient, PodResourcesError
from agent.queuedelivery import QueueDelivery
from agent.settings import (
    AgentExit,
    AgentSettings,
    SettingsError,
    parse_discover,
    parse_settings,
    unknown_variables,
)
from agent.shim_install import ShimInstallError, install_shim
from agent.slice_audit import SliceAudit, SliceAuditSettings
from fracgpu.codec import encode_device
from fracgpu.model import GPUDevice

log = logging.getLogger("agent")

_MAIN_WAKEUP_SECONDS = 0.5


class KubeConfigError(Exception):
    """No usable credentials for the Kubernetes API."""


def _kube_api_client(settings: AgentSettings) -> Any:
    config: Any = kube_config  # the loaders are untyped
    try:
        if settings.kubeconfig is not None:
            return config.new_client_from_config(config_file=str(settings.kubeconfig))
        config.load_incluster_config()
    except (config.ConfigException, OSError, yaml.YAMLError) as error:
        where = settings.kubeconfig or "the in-cluster service account"
        mark = getattr(error, "problem_mark", None)
        reason = (
            f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}"
            if mark is not None
            else " ".join(str(error).split())
        )
        raise KubeConfigError(
            f"cannot load Kubernetes credentials from {where}: {reason}; "
            "run in a pod with a service account or pass --kubeconfig"
        ) from None
    return client.ApiClient()


def discover_command() -> int:
    """Print what NVML reports as JSON (no cluster needed): for checks on a GPU machine."""
    backend = PynvmlBackend()
    try:
        gpus = discover(backend)
        report = {
            "driverVersion": gpus.driver_version,
            "cudaDriverVersion": gpus.cuda_driver_version,
            "devices": [
                {**encode_device(d), "usage": vars(backend.device_usage(d.uuid))}
                for d in gpus.devices
            ],
        }
    finally:
        backend.shutdown()
    print(json.dumps(report, indent=2))
    return 0


def _host_files(
    settings: AgentSettings, gpus: list[str]
) -> tuple[AllocationFiles, BoardFiles, BoardLoop]:
    """The per-container files, the node's priority boards (the node directory emptied of
    all but the agent's own boards first), and the loop that rewrites the boards from every
    container's region (started with the rest)."""
    files = AllocationFiles(settings.host_state_dir, settings.kubelet_pods_dir)
    # The record of the boards' inodes is in the state directory, which no container writes.
    board_files = BoardFiles(settings.host_node_dir, settings.host_state_dir / BOARD_RECORD)
    board_files.prepare()
    publisher = BoardPublisher(board_files, lambda: gpus, allocation_sources(files))
    return files, board_files, BoardLoop(publisher, settings.board_publish_seconds)


class _Background(Protocol):
    def start(self) -> None: ...
    def stop(self) -> object: ...


def _slice_audit(
    s: AgentSettings, backend: PynvmlBackend, containers: Callable[[], list[LiveContainer]]
) -> SliceAudit:
    settings = SliceAuditSettings(
        proc_dir=s.slice_audit_proc_dir,
        tolerance_bytes=s.slice_audit_tolerance_bytes,
        kill=s.slice_audit_kill,
    )
    return SliceAudit(backend, containers, settings)


@dataclass
class Agent:
    settings: AgentSettings

    def run(self, stop: threading.Event) -> None:
        s = self.settings
        backend = PynvmlBackend()
        gpus = discover(backend)
        log.info(
            "GPUs discovered",
            extra={
                "gpus": [d.uuid for d in gpus.devices],
                "driver": gpus.driver_version,
                "cuda": gpus.cuda_driver_version,
            },
        )
        shim = install_shim(s.shim_source, s.host_lib_dir)
        context_overhead, overhead_source = _context_overhead(s, backend, gpus.devices)
        state = DeviceState(gpus.devices, s.memory_scaling)
        health = HealthMonitor(
            backend,
            [d.uuid for d in gpus.devices],
            probe_seconds=s.health_probe_seconds,
            xid_recovery_seconds=s.xid_recovery_seconds,
            ignored_xids=s.ignored_xids,
        )
        health.add_listener(state.set_health)
        api_client = _kube_api_client(s)
        files, board_files, boards = _host_files(s, [d.uuid for d in gpus.devices])
        resources = (s.compute_resource, s.memory_resource)
        # kubelet gives PreStartContainer 30 s: 10 lookups of at most 2 s, 0.5 s apart, fit.
        pod_resources = PodResourcesClient(s.pod_resources_socket, timeout_seconds=2.0)
        core_api = client.CoreV1Api(api_client)
        delivery = QueueDelivery(
            node_name=s.node_name,
            pods=KubernetesNodePods(core_api),
            known_pods=pod_resources.known_pods,
            files=files,
        )
        starter = ContainerStarter(
            node_name=s.node_name,
            resources=resources,
            pod_resources=pod_resources,
            pods=KubernetesPodLookup(core_api),
            files=files,
            gpus=state.gpus,
            lookup_attempts=s.prestart_lookup_attempts,
            lookup_interval_seconds=s.prestart_lookup_interval_seconds,
            delivery=delivery,
            context_overhead_bytes=context_overhead,
        )
        plugins = [
            DevicePlugin(
                kind=kind,
                resource_name=name,
                state=state,
                starter=starter,
                files=files,
                shim=shim,
                boards=board_files,
            )
            for kind, name in zip(
                (ResourceKind.COMPUTE, ResourceKind.MEMORY), resources, strict=True
            )
        ]
        manager = PluginManager(plugins, state, s.device_plugin_dir, s.kubelet_poll_seconds)
        inventory: InventoryLoop | None = None
        if s.publish_inventory:
            publisher = InventoryPublisher(
                client.CustomObjectsApi(api_client),
                s.node_name,
                on_spec=follow_memory_scaling(state.set_memory_scaling, s.memory_scaling),
            )
            inventory = InventoryLoop(publisher, gpus, health.snapshot, s.inventory_resync_seconds)
            health.add_listener(inventory.health_changed)

        def containers() -> list[LiveContainer]:
            return live_containers(pod_resources, resources, files)

        collector = AgentCollector(
            backend,
            lambda: state.gpus().values(),
            health.snapshot,
            containers,
            gpu_manager_metrics=s.gpu_manager_metrics,
            node_name=s.node_name,
        )
        audit = _slice_audit(s, backend, containers)
        http_server, http_thread = start_http_server(
            s.metrics_port,
            s.metrics_address,
            registry=build_registry(
                collector,
                audit,
                ContextOverheadCollector(context_overhead, overhead_source, s.node_name),
            ),
        )
        log.info("metrics serving", extra={"port": http_server.server_port})
        http_server.readiness = manager.readiness  # /readyz: registered with kubelet yet?

        # Started in this order, stopped in the reverse one.
        background: list[_Background] = [
            boards,  # first: a container started by the plugins finds its GPU's board
            health,
            manager,
            *([inventory] if inventory else []),
            Periodic(
                "slice-audit", audit.run_once, s.slice_audit_seconds, skipped="slice audit skipped"
            ),
        ]
        for part in background:
            part.start()
        housekeeper = Housekeeper(files, s.stale_grace_seconds)
        try:
            next_housekeeping = time.monotonic() + s.housekeeping_seconds
            # Short waits: a signal delivered to one of gRPC's threads does not interrupt a
            # long wait in this (main) thread, and Python runs its handler only here.
            while not stop.wait(_MAIN_WAKEUP_SECONDS):
                if time.monotonic() < next_housekeeping:
                    continue
                next_housekeeping = time.monotonic() + s.housekeeping_seconds
                try:
                    housekeeper.sweep(live_keys(pod_resources, resources))
                except PodResourcesError as error:
                    log.warning("housekeeping skipped", extra={"error": str(error)})
        finally:
            log.info("shutting down")
            for part in reversed(background):
                part.stop()
            http_server.shutdown()
            http_thread.join(timeout=5)
            backend.shutdown()
            log.info("stopped")


def _context_overhead(
    s: AgentSettings, backend: PynvmlBackend, devices: Sequence[GPUDevice]
) -> tuple[int, str]:
    """The bytes each CUDA context counts, as set or (``auto``) measured now, and which."""
    if s.context_overhead_bytes is not None:
        log.info("CUDA context overhead set", extra={"bytes": s.context_overhead_bytes})
        return s.context_overhead_bytes, "configured"
    measured = measure_node(
        [(d.uuid, d.model) for d in devices if d.shareable],
        backend,
        proc_dir=s.slice_audit_proc_dir,
        limit_bytes=MAX_CONTEXT_OVERHEAD_BYTES,
    )
    for uuid, reason in measured.failures.items():
        log.warning("CUDA context not measured", extra={"gpu": uuid, "error": reason})
    if measured.by_model:
        log.info(
            "CUDA context overhead measured",
            extra={"bytes": measured.bytes, "byModel": dict(measured.by_model)},
        )
        return measured.bytes, "measured"
    if devices:
        log.error(
            "CUDA contexts not counted",
            extra={
                "reason": "no GPU could be measured (see the warnings above): contexts take "
                "memory outside the slices; set --context-overhead-bytes to what one takes"
            },
        )
    return 0, "unmeasured"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["discover"]:
        try:
            parse_discover(args[1:])
        except AgentExit as done:
            return done.code
        except SettingsError as error:
            print(f"fracgpu-agent discover: {error}", file=sys.stderr)
            return 2
        setup_logging("WARNING")
        try:
            return discover_command()
        except NvmlError as error:
            print(f"fracgpu-agent discover: {error}", file=sys.stderr)
            return 1
    try:
        settings = parse_settings(args)
    except AgentExit as done:
        return done.code
    except SettingsError as error:
        print(f"fracgpu-agent: {error}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level)
    for message in unknown_variables(os.environ):
        log.warning(message)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal received", extra={"signal": signal.Signals(signum).name})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        Agent(settings).run(stop)
    except (NvmlError, ShimInstallError, KubeConfigError) as error:
        log.error("agent cannot start", extra={"error": str(error)})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
