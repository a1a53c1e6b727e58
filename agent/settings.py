"""The agent's one settings object, read from flags and environment in one place.

Every flag has an environment variable (``FRACGPU_AGENT_<FLAG>``) so a DaemonSet can set
it either way; a flag on the command line wins over the environment.
"""

import argparse
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.limits import MAX_CONTEXT_OVERHEAD_BYTES
from agent.slice_audit import DEFAULT_TOLERANCE_BYTES, MAX_TOLERANCE_BYTES, SliceAuditSettings
from fracgpu import __version__, envcheck
from fracgpu.names import MAX_MEMORY_SCALING, RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY
from fracgpu.switches import switch_value

ENV_PREFIX = "FRACGPU_AGENT_"
# --context-overhead-bytes: measure what a context takes at start-up.
_AUTO = "auto"

# XIDs caused by the application, not the GPU (illegal address, ECC page retirement
# notices handled by the driver, ...): the GPU stays healthy. Every other XID received
# through nvmlEventTypeXidCriticalError marks the GPU unhealthy.
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)


class SettingsError(ValueError):
    """A flag or environment value that cannot be used; says which and what is allowed."""


@dataclass(frozen=True)
class AgentSettings:
    node_name: str
    # kubelet side
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    # Where kubelet keeps pods' volumes: each GPU container's region volume is read there.
    kubelet_pods_dir: Path = Path("/var/lib/kubelet/pods")
    compute_resource: str = RESOURCE_VCUDA_CORE
    memory_resource: str = RESOURCE_VCUDA_MEMORY
    # Memory advertised = physical x this; the GPUNode's spec.memoryScaling overrides it.
    memory_scaling: float = 1.0
    # Device memory each CUDA context of a container counts against its slice (the
    # driver's own use); None: measured at start-up (``auto``, agent/context_probe.py);
    # 0: contexts are not counted (the slice audit still sees them).
    context_overhead_bytes: int | None = None
    # host side: where the shim library and per-container files live
    host_lib_dir: Path = Path("/var/lib/fracgpu/lib")
    host_state_dir: Path = Path("/var/lib/fracgpu/containers")
    host_node_dir: Path = Path("/var/lib/fracgpu/node")
    shim_source: Path = Path("/usr/local/fracgpu/lib/libfracgpu.so")
    # behaviour
    kubelet_poll_seconds: float = 1.0
    health_probe_seconds: float = 5.0
    xid_recovery_seconds: float = 300.0
    ignored_xids: tuple[int, ...] = DEFAULT_IGNORED_XIDS
    inventory_resync_seconds: float = 60.0
    stale_grace_seconds: float = 300.0
    housekeeping_seconds: float = 60.0
    # How often the GPUs' priority boards are rewritten from the containers' regions.
    board_publish_seconds: float = 0.02
    prestart_lookup_attempts: int = 10
    prestart_lookup_interval_seconds: float = 0.5
    # metrics and logs
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 9400
    # Also export TKEStack gpu-manager's container metric names (docs/agent.md).
    gpu_manager_metrics: bool = False
    log_level: str = "INFO"
    kubeconfig: Path | None = None
    publish_inventory: bool = True
    # NVML's per-process accounting checked against the pods' slices (agent/slice_audit.py):
    # how often, whether to SIGKILL a pod's processes past their slices, the driver context
    # memory allowed per process beyond the slice, and where the host's /proc is.
    slice_audit_seconds: float = 10.0
    slice_audit_kill: bool = False
    slice_audit_tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES
    slice_audit_proc_dir: Path = Path("/proc")


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _boolean(text: str) -> bool:
    """An on/off setting: the flag alone (true), ``--flag=true|false`` or its variable."""
    value = switch_value(text.strip())
    if value is None:
        raise ValueError("use true or false (or 1/0, yes/no), or the flag alone for true")
    return value


class _Setting(argparse.Action):
    """A flag's text, kept as given: ``parse_settings`` converts it (``convert``) with every
    other setting, flag or variable alike, so that one run reports every bad value."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        convert: Callable[[str], object] = str,
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.convert = convert

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)


class AgentExit(Exception):  # noqa: N818 - not an error: --help or --version was answered
    """The command line asked for help or the version, which was printed: exit with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown as an operator writes them: an on/off setting's as true or false."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if isinstance(action.default, bool):
            return f"{action.help} (default: {str(action.default).lower()})"
        return super()._get_help_string(action)


def _switch(p: argparse.ArgumentParser, flag: str, default: bool, help_text: str) -> None:
    """An on/off flag: alone it means true; ``--flag true|false`` (or ``=``) sets it."""
    p.add_argument(
        flag,
        nargs="?",
        const="true",
        default=default,
        convert=_boolean,
        metavar="true|false",
        help=help_text,
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fracgpu-agent",
        description="fracgpu node agent: GPU discovery, device plugin, limits, metrics. "
        "Every flag may also come from FRACGPU_AGENT_<FLAG> (e.g. FRACGPU_AGENT_METRICS_PORT); "
        "a flag on the command line wins. `fracgpu-agent discover` prints what NVML reports "
        "as JSON and exits.",
        formatter_class=_DefaultsHelpFormatter,
    )
    # Every flag that takes a value keeps its text; parse_settings converts and checks it.
    for name in (None, "store"):  # the default action, unnamed or by name
        p.register("action", name, _Setting)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    d = AgentSettings(node_name="")
    p.add_argument("--node-name", help="Kubernetes node name (env NODE_NAME also accepted)")
    p.add_argument(
        "--device-plugin-dir",
        convert=Path,
        default=d.device_plugin_dir,
        help="kubelet's device-plugin directory: kubelet.sock is there, the agent's sockets "
        "go there",
    )
    p.add_argument(
        "--pod-resources-socket",
        convert=Path,
        default=d.pod_resources_socket,
        help="kubelet's PodResources socket, to learn which container holds which devices",
    )
    p.add_argument(
        "--kubelet-pods-dir",
        convert=Path,
        default=d.kubelet_pods_dir,
        help="kubelet's pods directory (<kubelet root>/pods), where each GPU container's "
        "accounting region is, in its pod's region volume",
    )
    p.add_argument(
        "--compute-resource",
        default=d.compute_resource,
        help="extended resource advertised for compute (100 = one whole GPU)",
    )
    p.add_argument(
        "--memory-resource",
        default=d.memory_resource,
        help="extended resource advertised for GPU memory (one unit = 256 MiB)",
    )
    p.add_argument(
        "--memory-scaling",
        convert=float,
        default=d.memory_scaling,
        help="memory advertised = physical x this, 1-16 (the webhook's memory_scaling; "
        "a GPUNode's spec.memoryScaling overrides it)",
    )
    p.add_argument(
        "--host-lib-dir",
        convert=Path,
        default=d.host_lib_dir,
        help="host directory the preload shim is installed into and mounted from",
    )
    p.add_argument(
        "--host-state-dir",
        convert=Path,
        default=d.host_state_dir,
        help="host directory of the per-container limits files",
    )
    p.add_argument(
        "--host-node-dir",
        convert=Path,
        default=d.host_node_dir,
        help="host directory of the node's priority boards, mounted into every GPU container",
    )
    p.add_argument(
        "--shim-source",
        convert=Path,
        default=d.shim_source,
        help="the shim library in the agent's image, copied to --host-lib-dir at start",
    )
    p.add_argument(
        "--kubelet-poll-seconds",
        convert=float,
        default=d.kubelet_poll_seconds,
        help="how often kubelet's socket is checked (to register again after a restart)",
    )
    p.add_argument(
        "--health-probe-seconds",
        convert=float,
        default=d.health_probe_seconds,
        help="how often each GPU is probed through NVML",
    )
    p.add_argument(
        "--xid-recovery-seconds",
        convert=float,
        default=d.xid_recovery_seconds,
        help="how long a GPU must keep answering after a critical XID to count as healthy again",
    )
    p.add_argument(
        "--ignored-xids",
        default=",".join(map(str, d.ignored_xids)),
        help="comma-separated XIDs that do not make a GPU unhealthy",
    )
    p.add_argument(
        "--inventory-resync-seconds",
        convert=float,
        default=d.inventory_resync_seconds,
        help="how often the GPUNode object is written again even without a change",
    )
    p.add_argument(
        "--stale-grace-seconds",
        convert=float,
        default=d.stale_grace_seconds,
        help="how old an allocation directory no running container owns must be to be removed",
    )
    p.add_argument(
        "--housekeeping-seconds",
        convert=float,
        default=d.housekeeping_seconds,
        help="how often allocation directories no running container owns are looked for",
    )
    p.add_argument(
        "--board-publish-seconds",
        convert=float,
        default=d.board_publish_seconds,
        help="how often the GPUs' priority boards are rewritten (0.005 to 1)",
    )
    p.add_argument(
        "--prestart-lookup-attempts",
        convert=int,
        default=d.prestart_lookup_attempts,
        help="PreStartContainer: how many times kubelet's PodResources is asked for the "
        "container's devices",
    )
    p.add_argument(
        "--prestart-lookup-interval-seconds",
        convert=float,
        default=d.prestart_lookup_interval_seconds,
        help="PreStartContainer: pause between those lookups",
    )
    p.add_argument(
        "--metrics-address",
        default=d.metrics_address,
        help="address of the HTTP endpoint (/metrics, /readyz, /healthz)",
    )
    p.add_argument(
        "--metrics-port",
        convert=int,
        default=d.metrics_port,
        help="port of the HTTP endpoint (/metrics, /readyz, /healthz), 0 = any free port",
    )
    _switch(
        p,
        "--gpu-manager-metrics",
        d.gpu_manager_metrics,
        "also export TKEStack gpu-manager's metric names: true or false "
        "(the flag alone means true)",
    )
    p.add_argument("--log-level", default=d.log_level, help="one of " + ", ".join(_LOG_LEVELS))
    p.add_argument("--kubeconfig", convert=Path, default=None, help="default: in-cluster config")
    p.add_argument(
        "--slice-audit-seconds",
        convert=float,
        default=d.slice_audit_seconds,
        help="how often NVML's per-process GPU memory is checked against the pods' slices "
        "(memory taken around the shim, e.g. by a statically linked driver)",
    )
    _switch(
        p,
        "--slice-audit-kill",
        d.slice_audit_kill,
        "SIGKILL a pod's processes on a GPU where they hold more than their slices: "
        "true or false (false: log and metrics only; the flag alone means true)",
    )
    p.add_argument(
        "--context-overhead-bytes",
        default=_AUTO if d.context_overhead_bytes is None else str(d.context_overhead_bytes),
        help="GPU memory each CUDA context of a container counts against its slice (the "
        "driver's own memory for the context: every process's primary context and each one "
        f"it creates): auto (measured at start-up on one GPU of each model; the default) or "
        f"0 to {MAX_CONTEXT_OVERHEAD_BYTES} bytes; 0 counts none",
    )
    p.add_argument(
        "--slice-audit-tolerance-bytes",
        convert=int,
        default=d.slice_audit_tolerance_bytes,
        help="GPU memory per process allowed beyond the slice: what the process holds past "
        "the context the slice counts (driver memory the shim cannot see), at most this, "
        f"0 to {MAX_TOLERANCE_BYTES}",
    )
    p.add_argument(
        "--slice-audit-proc-dir",
        convert=Path,
        default=d.slice_audit_proc_dir,
        help="the host's /proc (PIDs from NVML are host PIDs): the agent runs with hostPID "
        "or mounts the host's /proc here",
    )
    _switch(
        p,
        "--no-publish-inventory",
        not d.publish_inventory,
        "do not write the GPUNode object (for running outside a cluster; without this "
        "flag the agent writes its node's): true or false (the flag alone means true)",
    )
    return p


def parse_discover(argv: Sequence[str]) -> None:
    """What follows ``fracgpu-agent discover``: nothing, --help or --version (both answered
    here, raising ``AgentExit``); anything else is a ``SettingsError``."""
    parser = argparse.ArgumentParser(
        prog="fracgpu-agent discover",
        description="Print what NVML reports (driver versions, every GPU and its usage) as "
        "JSON and exit; needs no cluster, only the NVIDIA driver.",
    )
    parser.add_argument("--version", action="version", version=f"fracgpu-agent {__version__}")
    try:
        _, extra = parser.parse_known_args(argv)
    except SystemExit as exit_:
        if not exit_.code:
            raise AgentExit(0) from None  # --help or --version: printed, nothing to run
        raise SettingsError("invalid command line (see the message above)") from exit_
    if extra:
        raise SettingsError(
            f"unexpected argument {extra[0]!r}: discover takes none, only --help or --version"
        )


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """A message per FRACGPU_AGENT_* variable that names no agent setting (logged at start)."""
    known = {_variable(a.option_strings[0]) for a in _settable(_parser())}
    return envcheck.unknown_variables(env, ENV_PREFIX, known)


def _settable(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags that are settings (each also a FRACGPU_AGENT_* variable)."""
    return [a for a in parser._actions if a.option_strings and a.dest not in ("help", "version")]


def _variable(flag: str) -> str:
    """The environment variable behind ``flag``: --metrics-port -> FRACGPU_AGENT_METRICS_PORT."""
    return ENV_PREFIX + flag.removeprefix("--").replace("-", "_").upper()


# What a value must be, by its flag's conversion (int() and float() speak Python instead).
_TYPE_WORDS: dict[object, str] = {int: "use a whole number", float: "use a number"}


def _written(source: str, raw: str) -> str:
    """A value as the operator wrote it: ``--flag=value`` or ``VARIABLE=value`` (quoted when
    empty or with spaces, where it would not be seen)."""
    shown = raw if raw and raw.strip() == raw and " " not in raw else repr(raw)
    return f"{source}={shown}"


def _read(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    env: Mapping[str, str],
    problems: list[str],
) -> tuple[argparse.Namespace, dict[str, str], set[str]]:
    """Flags first, then FRACGPU_AGENT_* for the settings no flag gave, then the defaults;
    with, per setting, where its value came from (flag or variable) for error messages, and
    the settings whose value could not be read (each one's problem added to ``problems``)."""
    settable = _settable(parser)
    # argparse leaves an attribute already set alone: what is still unset no flag gave.
    unset = object()
    ns, extra = parser.parse_known_args(
        argv, argparse.Namespace(**{a.dest: unset for a in settable})
    )
    if extra:
        problems.append(
            f"unrecognized argument{'s' if len(extra) > 1 else ''} {' '.join(extra)}: "
            "see fracgpu-agent --help for the flags"
        )
    sources: dict[str, str] = {}
    unreadable: set[str] = set()
    for action in settable:
        sources[action.dest] = action.option_strings[0]
        raw = getattr(ns, action.dest)
        if raw is unset:
            name = _variable(action.option_strings[0])
            if name not in env:
                setattr(ns, action.dest, action.default)
                continue
            sources[action.dest], raw = name, env[name]
        convert = getattr(action, "convert", str)
        try:
            setattr(ns, action.dest, convert(raw))
        except ValueError as error:
            words = _TYPE_WORDS.get(convert, str(error))
            problems.append(f"{_written(sources[action.dest], raw)} is not allowed: {words}")
            unreadable.add(action.dest)
    return ns, sources, unreadable


def _context_overhead(source: str, raw: str) -> int | None:
    """``auto`` (None: measured at start-up) or a byte count within the shim's bound."""
    if raw.strip().lower() == _AUTO:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_CONTEXT_OVERHEAD_BYTES:
        raise SettingsError(
            f"{source} must be auto or 0 to {MAX_CONTEXT_OVERHEAD_BYTES} "
            f"(bytes per CUDA context), not {raw}"
        )
    return value


def _given(ns: argparse.Namespace, sources: Mapping[str, str], dest: str) -> str:
    """``--flag=value`` or ``FRACGPU_AGENT_FLAG=value``, as the operator wrote it."""
    return f"{sources[dest]}={getattr(ns, dest)}"


def _number_problems(
    ns: argparse.Namespace, sources: Mapping[str, str], unreadable: set[str]
) -> list[str]:
    """What is wrong with the numbers that were read (each unreadable one is refused already)."""
    problems: list[str] = []
    given = functools.partial(_given, ns, sources)

    def check(*dests: str) -> bool:
        return not unreadable.intersection(dests)

    if check("slice_audit_tolerance_bytes"):
        try:  # the audit's own settings say what is allowed
            SliceAuditSettings(tolerance_bytes=ns.slice_audit_tolerance_bytes)
        except ValueError as error:
            problems.append(f"{sources['slice_audit_tolerance_bytes']}: {error}")
    for dest in (
        "kubelet_poll_seconds",
        "health_probe_seconds",
        "inventory_resync_seconds",
        "housekeeping_seconds",
        "slice_audit_seconds",
    ):
        if check(dest) and getattr(ns, dest) <= 0:
            problems.append(f"{sources[dest]} must be greater than 0, not {getattr(ns, dest)}")
    if check("prestart_lookup_attempts") and ns.prestart_lookup_attempts < 1:
        problems.append(
            f"{sources['prestart_lookup_attempts']} must be 1 or more, "
            f"not {ns.prestart_lookup_attempts}"
        )
    for dest in ("xid_recovery_seconds", "stale_grace_seconds", "prestart_lookup_interval_seconds"):
        if check(dest) and getattr(ns, dest) < 0:
            problems.append(f"{sources[dest]} must be 0 or more, not {getattr(ns, dest)}")
    if check("board_publish_seconds") and not 0.005 <= ns.board_publish_seconds <= 1.0:
        # A shim trusts a board for 2 s; high priority holds a GPU 50 ms past a launch.
        problems.append(f"{given('board_publish_seconds')} is not allowed: use 0.005 to 1")
    if check("metrics_port") and not 0 <= ns.metrics_port <= 65535:
        problems.append(f"{given('metrics_port')} is not allowed: use 0-65535")
    if check("memory_scaling") and not 1.0 <= ns.memory_scaling <= MAX_MEMORY_SCALING:
        problems.append(
            f"{given('memory_scaling')} is not allowed: use a factor from 1 to "
            f"{MAX_MEMORY_SCALING:g} (1 = no oversubscription)"
        )
    return problems


def parse_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> AgentSettings:
    """Build the settings from command-line flags and the environment; reject bad values,
    naming the flag or the variable the value came from. Every setting is checked before
    anything is refused, and every problem is reported in one ``SettingsError``."""
    env = os.environ if env is None else env
    parser = _parser()
    problems: list[str] = []
    try:
        ns, sources, unreadable = _read(parser, argv, env, problems)
    except SystemExit as exit_:
        if not exit_.code:
            raise AgentExit(0) from None  # --help or --version: printed, nothing to run
        raise SettingsError("invalid command line (see the message above)") from exit_

    given = functools.partial(_given, ns, sources)
    node_name = ns.node_name or env.get("NODE_NAME", "")
    if not node_name:
        problems.append("the node name is required: pass --node-name or set NODE_NAME")
    level = str(ns.log_level).upper()
    if level not in _LOG_LEVELS:
        problems.append(f"{given('log_level')} is not allowed: use one of {', '.join(_LOG_LEVELS)}")
    ignored: tuple[int, ...] = ()
    try:
        ignored = tuple(int(x) for x in str(ns.ignored_xids).split(",") if x.strip())
    except ValueError:
        problems.append(f"{given('ignored_xids')} is not allowed: use comma-separated integers")
    if (
        not unreadable.intersection(("slice_audit_kill", "slice_audit_proc_dir"))
        and ns.slice_audit_kill
        and ns.slice_audit_proc_dir != Path("/proc")
    ):
        # NVML's PIDs are the host's: signalling them from another PID namespace would hit
        # whatever process has that number there.
        problems.append(
            f"{sources['slice_audit_kill']} needs the host's PID namespace: run the agent with "
            f"hostPID and {sources['slice_audit_proc_dir']}=/proc "
            f"(not {ns.slice_audit_proc_dir})"
        )
    context_overhead_bytes = None
    try:
        context_overhead_bytes = _context_overhead(
            sources["context_overhead_bytes"], str(ns.context_overhead_bytes)
        )
    except SettingsError as error:
        problems.append(str(error))
    problems.extend(_number_problems(ns, sources, unreadable))
    for dest in ("compute_resource", "memory_resource"):
        if "/" not in getattr(ns, dest):
            problems.append(
                f"{given(dest)} is not allowed: "
                "use a domain-qualified resource name such as tencent.com/vcuda-core"
            )
    if ns.compute_resource == ns.memory_resource:
        problems.append(
            f"{sources['compute_resource']} and {sources['memory_resource']} must differ"
        )
    if problems:
        raise SettingsError("; ".join(problems))
    return AgentSettings(
        node_name=node_name,
        device_plugin_dir=ns.device_plugin_dir,
        pod_resources_socket=ns.pod_resources_socket,
        kubelet_pods_dir=ns.kubelet_pods_dir,
        compute_resource=ns.compute_resource,
        memory_resource=ns.memory_resource,
        memory_scaling=ns.memory_scaling,
        host_lib_dir=ns.host_lib_dir,
        host_state_dir=ns.host_state_dir,
        host_node_dir=ns.host_node_dir,
        shim_source=ns.shim_source,
        kubelet_poll_seconds=ns.kubelet_poll_seconds,
        health_probe_seconds=ns.health_probe_seconds,
        xid_recovery_seconds=ns.xid_recovery_seconds,
        ignored_xids=ignored,
        inventory_resync_seconds=ns.inventory_resync_seconds,
        stale_grace_seconds=ns.stale_grace_seconds,
        housekeeping_seconds=ns.housekeeping_seconds,
        board_publish_seconds=ns.board_publish_seconds,
        prestart_lookup_attempts=ns.prestart_lookup_attempts,
        prestart_lookup_interval_seconds=ns.prestart_lookup_interval_seconds,
        metrics_address=ns.metrics_address,
        metrics_port=ns.metrics_port,
        gpu_manager_metrics=ns.gpu_manager_metrics,
        log_level=level,
        kubeconfig=ns.kubeconfig,
        publish_inventory=not ns.no_publish_inventory,
        slice_audit_seconds=ns.slice_audit_seconds,
        slice_audit_kill=ns.slice_audit_kill,
        slice_audit_tolerance_bytes=ns.slice_audit_tolerance_bytes,
        slice_audit_proc_dir=ns.slice_audit_proc_dir,
        context_overhead_bytes=context_overhead_bytes,
    )
