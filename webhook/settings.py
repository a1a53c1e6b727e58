"""The webhook's one settings object, read once from flags and environment, then passed down.

Precedence: command-line flag, then environment variable, then the default. Every option is
declared once in ``OPTIONS``: flag, variable, default, help, and the scope that says which
commands read it (``fracgpu admit`` only the admission settings, ``fracgpu serve`` all of
them). ``Settings`` takes each default from there, and the defaults of settings that belong
to a part of the core (dialects, pod limits, the split count) come from that part. Relations
between settings are checked once, at start-up (``RELATIONS``). docs/configuration.md lists
every option by scope, and a test keeps the two in step.
"""

import argparse
import dataclasses
import posixpath
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, TypeVar

from fracgpu import envcheck, names
from fracgpu.dialects import MAX_GPUS_PER_CONTAINER, DialectConfig, ResourceNames
from fracgpu.errors import QuantityError
from fracgpu.model import MemoryRequest
from fracgpu.placement import Policy
from fracgpu.placement.fragmentation import HELD_WHOLE_NODES
from fracgpu.placement.view import (
    DEFAULT_SPLIT_COUNT,
    MAX_HELD_WHOLE_NODES,
    held_whole_nodes_problem,
)
from fracgpu.quantity import parse_quantity
from fracgpu.switches import switch_value
from webhook.admission.mutate import is_label_value
from webhook.admission.review import DEFAULT_MAX_BODY_BYTES
from webhook.rules.podbounds import COUNTED, PodLimits

ENV_PREFIX: Final = "FRACGPU_"
DEFAULT_SERVICE_ACCOUNTS: Final = (
    "system:serviceaccount:fracgpu-system:fracgpu-webhook",
    "system:serviceaccount:fracgpu-system:fracgpu-agent",
)

# The agent's defaults (docs/agent.md): device plugin and pod-resources sockets, pods'
# volumes (every GPU container's region volume), its state.
DEFAULT_PROTECTED_HOST_PATHS: Final = (
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/pod-resources",
    "/var/lib/kubelet/pods",
    "/var/lib/fracgpu",
)


_E = TypeVar("_E", bound=StrEnum)


class PlacementMode(StrEnum):
    """IMMEDIATE places a GPU pod at admission or refuses it; QUEUE creates one that does not
    fit now and lets it wait for fracgpu's scheduler (docs/configuration.md says when)."""

    IMMEDIATE = "immediate"
    QUEUE = "queue"


class SettingsError(ValueError):
    """A flag or environment variable with a value that cannot be used."""


class Scope(StrEnum):
    """Which commands read a setting: ``admit`` the admission ones, ``serve`` every scope."""

    ADMISSION = "admission"  # what admission decides with (fracgpu admit and serve)
    SERVING = "serving"  # HTTPS and the handling of requests (fracgpu serve)
    CLUSTER = "cluster"  # cluster mode: state in the Kubernetes API (fracgpu serve)


ADMIT_SCOPES: Final = (Scope.ADMISSION,)
SERVE_SCOPES: Final = (Scope.ADMISSION, Scope.SERVING, Scope.CLUSTER)
SCOPE_TITLES: Final = {
    Scope.ADMISSION: "admission settings",
    Scope.SERVING: "serving settings (HTTPS, requests)",
    Scope.CLUSTER: "cluster mode settings (state in the Kubernetes API, leader election)",
}


@dataclass(frozen=True)
class Option:
    """One setting: its flag, environment variable, parser and help text."""

    key: str
    default: str  # as an operator writes it; parsed like any value
    help: str
    parse: Callable[[str], object]
    scope: Scope = Scope.ADMISSION

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("use a whole number of 1 or more")
    return value


def _held_whole_nodes(text: str) -> int:
    value = int(text)
    problem = held_whole_nodes_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("use 0-65535 (0 picks a free port)")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("use a number of seconds above 0")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError("use a number of seconds of 0 or more")
    return value


def _https_url(text: str) -> str:
    if text and (not text.startswith("https://") or len(text) <= len("https://")):
        raise ValueError("use an https:// URL such as https://10.0.0.7:8443, or leave it empty")
    return text.rstrip("/")


def _host_paths(text: str) -> tuple[str, ...]:
    """Absolute directories below /, normalised once here ("/var//lib/" -> "/var/lib")."""
    paths = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in paths if not p.startswith("/") or posixpath.normpath(p) == "/"]
    if bad:
        raise ValueError(f"{bad[0]!r}: use absolute host directories below /, comma-separated")
    return tuple(posixpath.normpath("/" + p.lstrip("/")) for p in paths)


def _one_of(kind: type[StrEnum]) -> str:
    """The values a setting of this enum takes, for its help and its error alike."""
    return ", ".join(member.value for member in kind)


def _enum_of(kind: type[_E]) -> Callable[[str], _E]:
    def parse(text: str) -> _E:
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"use one of {_one_of(kind)}") from None

    return parse


def _scheduler_name(text: str) -> str:
    if not 1 <= len(text) <= 253 or not all(c.isalnum() or c in "-." for c in text):
        raise ValueError("use a DNS-1123 name such as fracgpu-scheduler")
    return text


def _optional_path(text: str) -> Path | None:
    return Path(text) if text else None


def _accounts(text: str) -> frozenset[str]:
    return frozenset(a.strip() for a in text.split(",") if a.strip())


_MEMORY_FORMS: Final = (
    "use a share of the card (50%), MiB as a plain whole number (4096) or a Kubernetes "
    "quantity of bytes (4Gi: Gi = 2^30 bytes; 4G = 4 x 10^9 bytes, about 3815 MiB)"
)


def _memory(text: str) -> MemoryRequest:
    """'100%' of the card, a MiB count ('4096') or a Kubernetes quantity of bytes: binary
    suffixes (Ki..Ei) count powers of 1024, decimal ones (k..E) powers of 1000 ('4G' is
    4 x 10^9 bytes, not 4 GiB), as Kubernetes reads them."""
    if text.endswith("%"):
        if not text[:-1].isdigit() or not 1 <= int(text[:-1]) <= 100:
            raise ValueError("use a whole 1%-100% of the card")
        return MemoryRequest(percent=int(text[:-1]))
    if text.isdigit():
        mib = int(text)
    else:
        try:
            mib = -(-int(parse_quantity(text)) // 2**20)
        except QuantityError:
            raise ValueError(f"{text!r} is none of these: {_MEMORY_FORMS}") from None
    if mib < 1:
        raise ValueError("use at least 1 MiB")
    block = names.MEMORY_BLOCK_MIB
    return MemoryRequest(mib=-(-mib // block) * block)


def _cores(text: str) -> int:
    value = int(text)
    if not 0 <= value <= names.CORES_PER_GPU:
        raise ValueError("use 0-100 (0 = best effort)")
    return value


def _memory_scaling(text: str) -> float:
    value = float(text)
    if not 1.0 <= value <= names.MAX_MEMORY_SCALING:
        raise ValueError(
            f"use a factor from 1 to {names.MAX_MEMORY_SCALING:g} (1 = no oversubscription)"
        )
    return value


def _gpu_count(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_GPUS_PER_CONTAINER:
        raise ValueError(f"use 1-{MAX_GPUS_PER_CONTAINER}")
    return value


_GPUSHARE_UNITS: Final = {"GiB": 1024, "MiB": 1}


def _gpushare_unit(text: str) -> int:
    if text not in _GPUSHARE_UNITS:
        raise ValueError("use GiB or MiB")
    return _GPUSHARE_UNITS[text]


def _flag(text: str) -> bool:
    """An on/off setting: ``--in-cluster`` alone, ``--in-cluster true`` or ``false`` (also
    1/0, yes/no); every on/off option is read here, flag or variable alike."""
    value = switch_value(text)
    if value is None:
        raise ValueError("use true or false (or 1/0, yes/no), or the flag alone for true")
    return value


def _identity(text: str) -> str:
    # Replicas need distinct identities for leader election; a pod's hostname is its name.
    return text or socket.gethostname()


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError("use DEBUG, INFO, WARNING or ERROR")
    return level


def _resource_name(text: str) -> str:
    if "/" not in text or text.startswith("/") or text.endswith("/"):
        raise ValueError("use a qualified extended resource name such as example.com/gpu")
    return text


# A Kubernetes label key, as a taint key must be: an optional DNS-subdomain prefix and "/",
# then a name with the syntax of a (non-empty) label value.
_DNS_LABEL: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_TAINT_PREFIX: Final = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")


def _taint_key(text: str) -> str:
    prefix, _, name = text.rpartition("/")
    if text and (
        not name
        or not is_label_value(name)
        or ("/" in text and (not _TAINT_PREFIX.fullmatch(prefix) or len(prefix) > 253))
    ):
        raise ValueError(
            "use a taint key such as fracgpu.io/gpu-node (an optional DNS prefix and '/', then "
            "at most 63 letters, digits, '-', '_' or '.'), or leave it empty"
        )
    return text


def _memory_text(memory: MemoryRequest) -> str:
    return f"{memory.percent}%" if memory.percent is not None else str(memory.mib)


_DIALECTS: Final = DialectConfig()
OPTIONS: Final[tuple[Option, ...]] = (
    Option("host", "0.0.0.0", "address to listen on", str, scope=Scope.SERVING),
    Option("port", "8443", "HTTPS port (0 picks a free one)", _port, scope=Scope.SERVING),
    Option(
        "tls_cert_file",
        "",
        "PEM certificate chain; reloaded when the file changes",
        _optional_path,
        scope=Scope.SERVING,
    ),
    Option(
        "tls_key_file",
        "",
        "PEM private key of the certificate",
        _optional_path,
        scope=Scope.SERVING,
    ),
    Option(
        "tls_reload_seconds",
        "5",
        "how often the TLS files are checked for changes",
        _positive_float,
        scope=Scope.SERVING,
    ),
    Option(
        "cluster_file",
        "",
        "embedded cluster state (YAML/JSON): nodes, GPUs, pods, quotas",
        _optional_path,
    ),
    Option(
        "policy",
        "fragmentation",
        f"default placement policy, one of {_one_of(Policy)} (fragmentation learns the "
        "workload and keeps room for it)",
        _enum_of(Policy),
    ),
    Option(
        "held_whole_nodes",
        str(HELD_WHOLE_NODES),
        "fragmentation policy: once this many or fewer untouched nodes are left that the "
        "multi-GPU pods still expected need, narrower pods that fit only there wait (are "
        f"refused without the queue); 0 holds none, at most {MAX_HELD_WHOLE_NODES}",
        _held_whole_nodes,
    ),
    Option(
        "held_wait_seconds",
        "300",
        "queue mode: a pod held off the last whole nodes (--held-whole-nodes) may take one "
        "once it has waited this long",
        _non_negative_float,
    ),
    Option(
        "service_accounts",
        ",".join(DEFAULT_SERVICE_ACCOUNTS),
        "comma-separated usernames allowed to set fracgpu's annotations and variables",
        _accounts,
    ),
    Option(
        "max_body_bytes",
        str(DEFAULT_MAX_BODY_BYTES),
        "largest AdmissionReview body accepted",
        _positive_int,
        scope=Scope.SERVING,
    ),
    *(
        Option(f.name, str(f.default), f"most {COUNTED[f.name]} in one pod", _positive_int)
        for f in dataclasses.fields(PodLimits)
    ),
    Option(
        "screen_body_bytes",
        str(128 * 1024),
        "reviews larger than this are parsed and checked against the pod limits in a worker "
        "process first, off the event loop that answers every other review",
        _positive_int,
        scope=Scope.SERVING,
    ),
    Option(
        "screen_workers",
        "1",
        "worker processes for large reviews (also the most such reviews read at once)",
        _positive_int,
        scope=Scope.SERVING,
    ),
    Option(
        "default_gpu_memory",
        _memory_text(_DIALECTS.default_memory),
        "memory per GPU when a dialect omits it: 50%, 4096 (MiB) or a quantity of bytes such "
        "as 4Gi (Gi = 2^30; G = 10^9: 4G is about 3815 MiB)",
        _memory,
    ),
    Option(
        "default_gpu_cores",
        str(_DIALECTS.default_cores),
        "compute per GPU when a dialect omits it (0 = best effort)",
        _cores,
    ),
    Option(
        "default_gpu_count",
        str(_DIALECTS.default_gpu_count),
        "GPUs for a container that names memory but no GPU count: HAMi gpumem/gpucores "
        "without nvidia.com/gpu (HAMi defaultGPUNum), TKEStack vcuda-memory alone, gpushare "
        "gpu-mem without gpu-count",
        _gpu_count,
    ),
    Option(
        "gpushare_memory_unit",
        next(k for k, v in _GPUSHARE_UNITS.items() if v == _DIALECTS.gpushare_memory_unit_mib),
        "unit of aliyun.com/gpu-mem: GiB or MiB",
        _gpushare_unit,
    ),
    Option(
        "split_count",
        str(DEFAULT_SPLIT_COUNT),
        "most containers sharing one GPU (per-node override in the inventory)",
        _positive_int,
    ),
    Option(
        "memory_scaling",
        "1",
        "GPU memory offered = physical x this; above 1 the shim serves the excess from host "
        "memory (per-node override in the inventory)",
        _memory_scaling,
    ),
    Option(
        "disable_core_limit",
        "false",
        "do not pace compute, keep only memory limits (per-node override in the inventory)",
        _flag,
    ),
    Option(
        "reservation_ttl_seconds",
        "300",
        "how long a reservation waits for its pod to appear",
        _positive_int,
    ),
    Option(
        "placement_attempts",
        "8",
        "placement retries when a reservation loses a race",
        _positive_int,
    ),
    Option("log_level", "INFO", "DEBUG, INFO, WARNING or ERROR", _log_level),
    Option(
        "kubeconfig",
        "",
        "cluster mode: kubeconfig of the API server holding the state (not with cluster_file)",
        _optional_path,
        scope=Scope.CLUSTER,
    ),
    Option(
        "in_cluster",
        "false",
        "cluster mode with the pod's service account",
        _flag,
        scope=Scope.CLUSTER,
    ),
    Option(
        "identity",
        "",
        "this replica's name for leader election (default hostname)",
        _identity,
        scope=Scope.CLUSTER,
    ),
    Option(
        "lease_namespace",
        "fracgpu-system",
        "namespace of the leader-election Lease",
        str,
        scope=Scope.CLUSTER,
    ),
    Option(
        "lease_name",
        "fracgpu-webhook",
        "name of the leader-election Lease",
        str,
        scope=Scope.CLUSTER,
    ),
    Option(
        "settle_seconds",
        "5",
        "how long a reservation outlives its pod's appearance (covers replicas' watch lag)",
        _positive_float,
        scope=Scope.CLUSTER,
    ),
    Option(
        "controller_interval_seconds",
        "5",
        "how often the leader prunes reservations and recounts quotas",
        _positive_float,
        scope=Scope.CLUSTER,
    ),
    Option(
        "advertise_url",
        "",
        "cluster mode: this replica's https:// URL where the others forward GPU pods while it "
        "leads (default https://HOST:PORT unless HOST is a wildcard; the chart sets the pod IP)",
        _https_url,
        scope=Scope.CLUSTER,
    ),
    Option(
        "takeover_grace_seconds",
        "30",
        "cluster mode: how long a new leader waits before placing when its predecessor did not "
        "hand over (covers admissions of a crashed leader still on their way to storage)",
        _non_negative_float,
        scope=Scope.CLUSTER,
    ),
    Option(
        "write_behind_seconds",
        "0.2",
        "cluster mode: how long the leader gathers reservations and quota charges before "
        "writing them to GPUNodes and GPUQuotas",
        _positive_float,
        scope=Scope.CLUSTER,
    ),
    Option(
        "self_check_interval_seconds",
        "60",
        "cluster mode: how often the leader compares its reservations and counted use with a "
        "recount from pods and GPUNodes, and repairs what differs",
        _positive_float,
        scope=Scope.CLUSTER,
    ),
    Option(
        "protected_host_paths",
        ",".join(DEFAULT_PROTECTED_HOST_PATHS),
        "host directories no pod of a managed namespace may mount with hostPath (nor a "
        "directory above them): the agent's and the device plugins' (match the agent's flags)",
        _host_paths,
    ),
    Option(
        "admission_window_seconds",
        "30",
        "a reservation that fracgpu's validating webhook has not seen this long after mutation, "
        "or whose pod is not stored this long after validation, is given back (a later "
        "admission step refused the pod); 30 = the longest webhook timeout",
        _positive_float,
    ),
    Option(
        "placement_mode",
        PlacementMode.IMMEDIATE.value,
        "immediate: a GPU pod that does not fit now is refused at admission; queue: it is "
        "created and waits Pending for the fracgpu scheduler, which places it when room frees",
        _enum_of(PlacementMode),
    ),
    Option(
        "gpu_node_taint",
        "",
        "key of a NoSchedule taint the GPU nodes carry: every GPU pod fracgpu admits gets a "
        "toleration of it, and a pod without GPUs that tolerates it is refused (empty: none)",
        _taint_key,
    ),
    Option(
        "scheduler_name",
        names.DEFAULT_SCHEDULER_NAME,
        "queue mode: schedulerName of queued pods (the second kube-scheduler calling the extender)",
        _scheduler_name,
    ),
    Option(
        "extender_port",
        "8889",
        "cluster mode, queue mode: port of the scheduler extender, served over plain HTTP on "
        "127.0.0.1 only (the scheduler runs in the same pod); 0 = none",
        _port,
        scope=Scope.CLUSTER,
    ),
    *(
        Option(
            f"resource_{f.name}",
            str(f.default),
            f"resource name for {f.name.replace('_', '-')}",
            _resource_name,
        )
        for f in dataclasses.fields(ResourceNames)
    ),
)


def _option(key: str) -> Option:
    return next(o for o in OPTIONS if o.key == key)


def option_flag(key: str) -> str:
    """The command-line flag of a setting, for messages."""
    return _option(key).flag


def _default(key: str) -> Any:
    """A setting's default, parsed from its one declaration in ``OPTIONS``."""
    option = _option(key)
    return option.parse(option.default)


@dataclass(frozen=True)
class Settings:
    host: str = _default("host")  # a Service reaches the pod on its pod IP
    port: int = _default("port")
    tls_cert_file: Path | None = _default("tls_cert_file")
    tls_key_file: Path | None = _default("tls_key_file")
    tls_reload_seconds: float = _default("tls_reload_seconds")
    cluster_file: Path | None = _default("cluster_file")
    policy: Policy = _default("policy")
    held_whole_nodes: int = _default("held_whole_nodes")
    held_wait_seconds: float = _default("held_wait_seconds")
    service_accounts: frozenset[str] = _default("service_accounts")
    max_body_bytes: int = _default("max_body_bytes")
    # The pod limits, dialect defaults and resource names have their defaults in their own
    # classes (each option is declared from them).
    pod_limits: PodLimits = dataclasses.field(default_factory=PodLimits)
    screen_body_bytes: int = _default("screen_body_bytes")
    screen_workers: int = _default("screen_workers")
    dialects: DialectConfig = dataclasses.field(default_factory=DialectConfig)
    # Node defaults; a GPUNode's spec (or the cluster file) may override each per node.
    split_count: int = _default("split_count")
    memory_scaling: float = _default("memory_scaling")
    disable_core_limit: bool = _default("disable_core_limit")
    reservation_ttl_seconds: int = _default("reservation_ttl_seconds")
    placement_attempts: int = _default("placement_attempts")
    log_level: str = _default("log_level")
    # Cluster mode (state in the Kubernetes API) instead of a cluster file.
    kubeconfig: Path | None = _default("kubeconfig")
    in_cluster: bool = _default("in_cluster")
    identity: str = _default("identity")
    lease_namespace: str = _default("lease_namespace")
    lease_name: str = _default("lease_name")
    settle_seconds: float = _default("settle_seconds")
    controller_interval_seconds: float = _default("controller_interval_seconds")
    advertise_url: str = _default("advertise_url")
    takeover_grace_seconds: float = _default("takeover_grace_seconds")
    write_behind_seconds: float = _default("write_behind_seconds")
    self_check_interval_seconds: float = _default("self_check_interval_seconds")
    # Host directories no pod of a managed namespace may mount (webhook.admission.shimguard).
    protected_host_paths: tuple[str, ...] = _default("protected_host_paths")
    # How long a reservation waits for a sign that its pod passed the rest of admission.
    admission_window_seconds: float = _default("admission_window_seconds")
    # The taint that keeps pods without GPUs off GPU nodes ("": none): GPU pods tolerate it.
    gpu_node_taint: str = _default("gpu_node_taint")
    # Queue mode (webhook/queue): the mode, the scheduler queued pods wait for, and the
    # loopback port of the extender that scheduler calls (0: no extender).
    placement_mode: PlacementMode = _default("placement_mode")
    scheduler_name: str = _default("scheduler_name")
    extender_port: int = _default("extender_port")

    @property
    def cluster_mode(self) -> bool:
        return self.kubeconfig is not None or self.in_cluster


@dataclass(frozen=True)
class Relation:
    """Setting ``lower`` must stay below setting ``upper`` (``or_equal``: may equal it)."""

    lower: str
    upper: str
    why: str
    or_equal: bool = False

    def holds(self, values: Mapping[str, Any]) -> bool:
        low, high = values[self.lower], values[self.upper]
        return bool(low <= high if self.or_equal else low < high)

    def message(self, values: Mapping[str, Any], sources: Mapping[str, str]) -> str:
        """Both settings named as they were given (flag or variable), with their values."""
        bound = "at most" if self.or_equal else "less than"
        return (
            f"{_with_value(self.lower, values, sources)} must be {bound} "
            f"{_with_value(self.upper, values, sources)}: {self.why}"
        )


RELATIONS: Final[tuple[Relation, ...]] = (
    Relation(
        "settle_seconds",
        "reservation_ttl_seconds",
        "a reservation stays until its pod has been live for the settle time, so it must not "
        "expire first",
    ),
    Relation(
        "admission_window_seconds",
        "reservation_ttl_seconds",
        "the window gives back the reservations of refused pods sooner than the TTL, and a "
        "reservation must not expire while its pod may still be in admission",
    ),
    Relation(
        "write_behind_seconds",
        "admission_window_seconds",
        "a claim whose pod has not appeared must reach its GPUNode, where the other replicas "
        "and a successor see it, while its pod may still be in admission",
    ),
    Relation(
        "controller_interval_seconds",
        "reservation_ttl_seconds",
        "the controllers prune expired reservations every round; rounds a TTL apart would "
        "let them hold GPUs for up to twice their TTL",
    ),
    Relation(
        "settle_seconds",
        "takeover_grace_seconds",
        "the settle time is also a new leader's wait after a clean handover, and after a "
        "crash (claims possibly unwritten) it must wait at least as long",
        or_equal=True,
    ),
)


def add_arguments(parser: argparse.ArgumentParser, scopes: Sequence[Scope] = SERVE_SCOPES) -> None:
    """Declare the options of ``scopes`` as flags, one group per scope (default None, so
    the environment can fill them in); a command shows only the flags it reads."""
    for scope in scopes:
        group = parser.add_argument_group(f"{SCOPE_TITLES[scope]} (flag, or environment variable)")
        for option in OPTIONS:
            if option.scope is not scope:
                continue
            if option.parse is _flag:  # on/off: alone, or with true/false (parsed in load)
                group.add_argument(
                    option.flag,
                    dest=option.key,
                    default=None,
                    nargs="?",
                    const="true",
                    metavar="true|false",
                    help=_help(option),
                )
                continue
            group.add_argument(
                option.flag,
                dest=option.key,
                default=None,
                metavar=option.key.upper(),
                help=_help(option),
            )


def _help(option: Option) -> str:
    text = f"{option.help} [env {option.env}, default {option.default or '(none)'}]"
    return text.replace("%", "%%")  # argparse formats help with %: a literal one is doubled


def load(
    flags: argparse.Namespace | None,
    environ: Mapping[str, str],
    scopes: Sequence[Scope] = SERVE_SCOPES,
) -> Settings:
    """Build the settings; every bad value raises ``SettingsError`` naming its source (the
    flag or the variable it came from). Options outside ``scopes`` (those the command does
    not read) keep their defaults."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}  # key -> the flag or variable that gave it; absent: default
    for option in OPTIONS:
        raw = option.default
        if option.scope in scopes:
            if option.env in environ:
                raw, sources[option.key] = environ[option.env], option.env
            flag_value = getattr(flags, option.key, None) if flags is not None else None
            if flag_value is not None:
                raw, sources[option.key] = str(flag_value), option.flag
        try:
            values[option.key] = option.parse(raw)
        except ValueError as error:
            source = _named(option.key, sources)
            raise SettingsError(f"{source}={raw!r} is not allowed: {_reason(error)}") from None
    _check_kubeconfig(values, sources)
    return _assemble(values, sources)


def _named(key: str, sources: Mapping[str, str]) -> str:
    """The flag or variable that gave setting ``key``; its flag when it kept its default."""
    return sources.get(key, _option(key).flag)


def _with_value(key: str, values: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """``FRACGPU_SETTLE_SECONDS (400)``, or ``--reservation-ttl-seconds (default 300)``."""
    shown = _shown(values[key])
    return (
        f"{sources[key]} ({shown})" if key in sources else f"{_option(key).flag} (default {shown})"
    )


def _as_written(key: str, sources: Mapping[str, str], value: object) -> str:
    """A setting as the operator wrote it: ``--kubeconfig FILE`` or ``FRACGPU_KUBECONFIG=FILE``."""
    source = _named(key, sources)
    return f"{source} {value}" if source.startswith("--") else f"{source}={value}"


def _check_kubeconfig(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Cluster mode's kubeconfig must exist at start, not when the API is first needed; the
    message names the flag or the variable that gave it."""
    kubeconfig: Path | None = values["kubeconfig"]
    if kubeconfig is None or values["in_cluster"] or kubeconfig.is_file():
        return
    what = "the file does not exist" if not kubeconfig.exists() else "it is not a file"
    raise SettingsError(
        f"{_as_written('kubeconfig', sources, kubeconfig)}: {what} (give the path of a "
        f"kubeconfig file, or {option_flag('in_cluster')} in a pod with a service account)"
    )


def _reason(error: ValueError) -> str:
    """The parser's own words for people; int() and float() speak Python instead."""
    text = str(error)
    if text.startswith("invalid literal for int()"):
        return "not a whole number"
    if text.startswith("could not convert string to float"):
        return "not a number"
    return text


# Variables other components read from the same prefix (the agent's, the certs manager's).
OTHER_COMPONENT_PREFIXES: Final = ("FRACGPU_AGENT_", "FRACGPU_CERTS_")


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A message per FRACGPU_* variable that names no webhook setting (``serve`` logs them)."""
    return envcheck.unknown_variables(
        environ, ENV_PREFIX, {o.env for o in OPTIONS}, OTHER_COMPONENT_PREFIXES
    )


def from_mapping(overrides: Mapping[str, str]) -> Settings:
    """Settings from option keys (as strings), the rest defaults; for embedding and tests."""
    unknown = set(overrides) - {o.key for o in OPTIONS}
    if unknown:
        raise SettingsError(f"unknown setting(s) {', '.join(sorted(unknown))}")
    return load(None, {ENV_PREFIX + k.upper(): v for k, v in overrides.items()})


def _shared_resource_names(names_: ResourceNames, sources: Mapping[str, str]) -> str:
    """One clause per name given to several resources: which settings, and the name."""

    def setting(field_name: str) -> str:
        key = f"resource_{field_name}"
        return sources.get(key, f"{_option(key).flag} (its default)")

    clauses = []
    for name, shared in names_.shared().items():
        given = [setting(f) for f in shared]
        listed = f"{', '.join(given[:-1])} and {given[-1]}"
        clauses.append(f"{listed} are {'both' if len(given) == 2 else 'all'} {name!r}")
    return (
        f"{'; '.join(clauses)}: each --resource-* setting must name a different resource "
        "(a request could not be told apart otherwise); give each its own name"
    )


def _assemble(values: Mapping[str, Any], sources: Mapping[str, str]) -> Settings:
    resource_names = ResourceNames(
        **{f.name: values[f"resource_{f.name}"] for f in dataclasses.fields(ResourceNames)}
    )
    if resource_names.shared():
        raise SettingsError(_shared_resource_names(resource_names, sources))
    if values["cluster_file"] is not None and (values["kubeconfig"] or values["in_cluster"]):
        modes = [k for k in ("kubeconfig", "in_cluster") if values[k]]
        raise SettingsError(
            f"{' and '.join(_named(k, sources) for k in ('cluster_file', *modes))} exclude each "
            f"other: {option_flag('cluster_file')} keeps the state in a file, cluster mode "
            f"({option_flag('kubeconfig')} or {option_flag('in_cluster')}) in the Kubernetes "
            "API; pick one source of state"
        )
    broken = [r.message(values, sources) for r in RELATIONS if not r.holds(values)]
    if broken:
        raise SettingsError("; ".join(broken))
    cert, key = values["tls_cert_file"], values["tls_key_file"]
    if (cert is None) != (key is None):
        given, missing = ("tls_cert_file", "tls_key_file")[:: 1 if cert else -1]
        raise SettingsError(
            f"{_named(given, sources)} is set but {option_flag(missing)} "
            f"({_option(missing).env}) is not: {option_flag('tls_cert_file')} and "
            f"{option_flag('tls_key_file')} go together"
        )
    return Settings(
        host=values["host"],
        port=values["port"],
        tls_cert_file=cert,
        tls_key_file=key,
        tls_reload_seconds=values["tls_reload_seconds"],
        cluster_file=values["cluster_file"],
        policy=values["policy"],
        held_whole_nodes=values["held_whole_nodes"],
        held_wait_seconds=values["held_wait_seconds"],
        service_accounts=values["service_accounts"],
        max_body_bytes=values["max_body_bytes"],
        pod_limits=PodLimits(**{f.name: values[f.name] for f in dataclasses.fields(PodLimits)}),
        screen_body_bytes=values["screen_body_bytes"],
        screen_workers=values["screen_workers"],
        dialects=DialectConfig(
            names=resource_names,
            default_memory=values["default_gpu_memory"],
            default_cores=values["default_gpu_cores"],
            default_gpu_count=values["default_gpu_count"],
            gpushare_memory_unit_mib=values["gpushare_memory_unit"],
        ),
        split_count=values["split_count"],
        memory_scaling=values["memory_scaling"],
        disable_core_limit=values["disable_core_limit"],
        reservation_ttl_seconds=values["reservation_ttl_seconds"],
        placement_attempts=values["placement_attempts"],
        log_level=values["log_level"],
        kubeconfig=values["kubeconfig"],
        in_cluster=values["in_cluster"],
        identity=values["identity"],
        lease_namespace=values["lease_namespace"],
        lease_name=values["lease_name"],
        settle_seconds=values["settle_seconds"],
        controller_interval_seconds=values["controller_interval_seconds"],
        advertise_url=values["advertise_url"],
        takeover_grace_seconds=values["takeover_grace_seconds"],
        write_behind_seconds=values["write_behind_seconds"],
        self_check_interval_seconds=values["self_check_interval_seconds"],
        protected_host_paths=values["protected_host_paths"],
        admission_window_seconds=values["admission_window_seconds"],
        gpu_node_taint=values["gpu_node_taint"],
        placement_mode=values["placement_mode"],
        scheduler_name=values["scheduler_name"],
        extender_port=values["extender_port"],
    )


def describe(settings: Settings) -> Sequence[str]:
    """One line per effective setting, for the startup log."""
    return [f"{f.name}={_shown(getattr(settings, f.name))}" for f in dataclasses.fields(settings)]


def _shown(value: Any) -> str:
    """A setting as an operator writes it: paths and enums plain, sets as lists, nested
    settings as key=value pairs (no Python reprs in the log)."""
    if isinstance(value, (set, frozenset, tuple, list)):
        return ",".join(sorted(_shown(v) for v in value)) or "(none)"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        parts = (f"{f.name}={_shown(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return "{" + ", ".join(parts) + "}"
    if value is None or value == "":
        return "(unset)"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # 5, not 5.0
    return str(value)
