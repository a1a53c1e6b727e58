"""The whole node tier as one unit: start everything, hand out clients, stop everything.

    host loopback                              network namespace fracgpu-node-<pid>
    ─────────────                              ────────────────────────────────────
    etcd, kube-apiserver  ◄── forwarder ───── kubelet ──CRI──► containerd ─► fake toolkit ─► runc
    kube-scheduler, kube-controller-manager      ▲  device plugins, pod-resources (unix sockets)
    fracgpu webhook (behind the apiserver)       │
    fracgpu agent ───────────────────────────────┘        pods on the bridge fgpods0

`close()` leaves nothing running: processes stopped, tasks and containers removed, the
namespace deleted, the sysctls kubelet changed put back, the work directory removed
(kept with FRACGPU_E2E_KEEP=1).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from tests.chart.chartfiles import rbac_objects
from tests.e2e.harness import ControlPlane, E2EConfig, apply_crds
from tests.e2e.harness.binaries import Binaries
from tests.e2e.harness.identities import WEBHOOK_NAMESPACE, Identity
from tests.e2e.harness.process import ManagedProcess
from tests.e2e.scheduler_harness import fracgpu_scheduler
from tests.e2e.webhook_harness import (
    WebhookReplica,
    Webhooks,
    free_port,
    install_webhook_rbac,
    running_webhooks,
    selects_queue_mode,
    wait_placing,
)
from tests.promtext import scrape

from . import controllers
from .agent import SHIM_BUILD, Agent
from .binaries import NodeBinaries, NodeTierUnavailableError
from .cgroups import TierCgroup
from .forward import Forwarder
from .hostpaths import HostPaths, kubelet_running_here
from .image import build_image_archive
from .kubelet import DEVICE_PLUGIN_DIR, Kubelet
from .netns import NetworkNamespace
from .runtime import Containerd, write_toolkit_wrapper
from .sysctls import SysctlGuard

T = TypeVar("T")
NODE_NAME = "fracgpu-node-1"
GIB = 1 << 30
# One simulated GPU on the node (the fake driver's defaults otherwise).
GPU_UUID = "GPU-fa4e0000-0000-4000-8000-000000000000"
GPU_MEMORY = 16 * GIB
PROBES = ("mem_ops", "nvml_ops", "launch_ops")
# The Python running the tests, mounted read-only into client pods (tests/node/clients.py):
# the image carries the system libraries it and its ctypes module load.
PYTHON_PREFIX = Path(sys.base_prefix)
PYTHON_SITE = Path(sysconfig.get_paths()["purelib"])


# Packages with compiled modules that client pods import (tests/node/test_clients.py):
# cuda-bindings and cuda-core (C++), numba-cuda, numba and llvmlite (LLVM), numpy.
CLIENT_PACKAGES = ("cuda", "numba", "numba_cuda", "llvmlite", "numpy")


def cuda_runtime() -> list[Path]:
    """The host's CUDA runtime (libcudart.so.N, found as its loader finds it), which a CUDA
    image carries and numba-cuda loads; [] when the host has none."""
    listed = subprocess.run(
        ["ldconfig", "-p"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    found = []
    for line in listed:
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libcudart.so.") and "x86-64" in name and Path(path).exists():
            found.append(Path(path))
    return found


def python_closure() -> list[Path]:
    binary = Path(os.path.realpath(sys.executable))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    dynload = PYTHON_PREFIX / "lib" / version / "lib-dynload"
    compiled = [
        module
        for package in CLIENT_PACKAGES
        if (PYTHON_SITE / package).is_dir()
        for module in sorted((PYTHON_SITE / package).rglob("*.so"))
    ]
    return [binary, *sorted(dynload.glob("*.so")), *compiled]


def wait_for(
    predicate: Callable[[], T | None],
    what: str,
    timeout: float,
    explain: Callable[[], str] | None = None,
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            more = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{more}")
        time.sleep(0.25)


def _identities(node: str) -> tuple[Identity, ...]:
    return (
        Identity(key="kubelet", user=f"system:node:{node}", groups=("system:nodes",)),
        Identity(key="scheduler", user="system:kube-scheduler"),
        Identity(key="controller-manager", user="system:kube-controller-manager"),
    )


class NodeTier:
    def __init__(self, binaries: NodeBinaries, plane_binaries: Binaries, config: E2EConfig) -> None:
        self.binaries = binaries
        self.config = config
        self.timings: dict[str, float] = {}
        self._stack = contextlib.ExitStack()
        self._sysctls = SysctlGuard()
        self._host_paths = HostPaths()
        # Short: containerd's and kubelet's unix sockets live under it (108-byte limit).
        self.work = Path(tempfile.mkdtemp(prefix="fgn-", dir=config.scratch_dir))
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
        }
        self.plane = ControlPlane(plane_binaries, config, _identities(NODE_NAME))
        self.netns = NetworkNamespace(f"fracgpu-node-{os.getpid()}")
        self.cgroup = TierCgroup(f"fracgpu-node-{os.getpid()}")
        self.gpu_dir = self.work / "gpus"
        self.gpu_config = self.gpu_dir / "fake-gpus.conf"
        self.kubelet: Kubelet | None = None
        self.containerd: Containerd | None = None
        self.agent: Agent | None = None
        self.webhooks: Webhooks | None = None
        self.processes: list[ManagedProcess] = []

    # --- start ------------------------------------------------------------------------
    def _timed(self, what: str, action: Callable[[], T]) -> T:
        start = time.monotonic()
        value = action()
        self.timings[what] = round(time.monotonic() - start, 2)
        return value

    def start(self) -> NodeTier:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        begin = time.monotonic()
        if kubelet_running_here():
            raise NodeTierUnavailableError(
                f"a kubelet already serves {DEVICE_PLUGIN_DIR}/kubelet.sock on this machine: "
                "the tier's kubelet would take its device-plugin directory over"
            )
        self._timed("control plane", self.plane.start)
        self._stack.callback(self.plane.close)
        self.admin = self.plane.api_client("admin")
        apply_crds(self.admin)
        for process in (
            controllers.scheduler(
                self.binaries.kube_scheduler,
                self.work,
                self.plane.kubeconfig("scheduler"),
                self.env,
            ),
            controllers.controller_manager(
                self.binaries.kube_controller_manager,
                self.work,
                self.plane.kubeconfig("controller-manager"),
                self.plane.pki,
                self.env,
            ),
        ):
            process.start()
            self.processes.append(process)
        self._timed("network namespace", self.netns.create)
        self._stack.callback(self.netns.delete)
        forwarder = Forwarder(self.netns, self.plane.apiserver.port)
        self._stack.callback(forwarder.close)

        self.cgroup.create()
        self._stack.callback(self.cgroup.remove)
        self._write_fake_gpus()
        archive = self._timed(
            "image build",
            lambda: build_image_archive(
                self.work / "image.tar",
                self.binaries.busybox,
                {name: SHIM_BUILD / "tests" / name for name in PROBES},
                python_closure(),
                mounted=[PYTHON_SITE],
                libraries=cuda_runtime(),
            ),
        )
        wrapper = write_toolkit_wrapper(
            self.work / "fake-nvidia-runtime",
            runc=self.binaries.runc,
            driver_dir=SHIM_BUILD / "doubles",
            fake_gpu_dir=self.gpu_dir,
            fake_gpu_config=self.gpu_config,
            log=self.work / "toolkit.log",
        )
        self.containerd = Containerd(
            binary=self.binaries.containerd,
            ctr=self.binaries.ctr,
            work=self.work,
            netns=self.netns,
            runtime=wrapper,
            env=self.env,
        )
        self._timed("containerd", self.containerd.start)
        self._timed("image import", lambda: self.containerd.import_image(archive))  # type: ignore[union-attr]

        self.kubelet = Kubelet(
            binary=self.binaries.kubelet,
            work=self.work,
            netns=self.netns,
            node_name=NODE_NAME,
            kubeconfig=self.plane.kubeconfig("kubelet"),
            containerd_socket=self.containerd.socket,
            cgroup_root=f"/{self.cgroup.name}",
            env=self.env,
        )
        self._timed("kubelet healthy", self.kubelet.start)
        self._timed("node ready", self.wait_node_ready)
        self._sysctls.restore()

        self._install_agent_rbac()
        self.agent = Agent(
            work=self.work,
            node_name=NODE_NAME,
            kubeconfig=self.plane.kubeconfig("agent"),
            pod_resources_socket=self.kubelet.pod_resources_socket,
            kubelet_pods_dir=self.kubelet.root_dir / "pods",
            driver_env={
                "LD_LIBRARY_PATH": str(SHIM_BUILD / "doubles"),
                "FRACGPU_FAKE_GPU_CONFIG": str(self.gpu_config),
            },
            env=self.env,
        )
        self.agent.start()
        self._timed("gpu resources advertised", self.wait_gpu_allocatable)
        self.webhooks = self._timed(
            "webhook",
            lambda: self._stack.enter_context(
                running_webhooks(
                    self.admin,
                    self.plane.kubeconfig("webhook"),
                    self.work / "webhook",
                    [],
                    replicas=1,
                )
            ),
        )
        self.timings["tier start"] = round(time.monotonic() - begin, 2)

    def _write_fake_gpus(self) -> None:
        self.gpu_dir.mkdir(parents=True)
        self.gpu_dir.chmod(0o755)
        self.gpu_config.write_text(
            f"state_file={self.gpu_dir / 'state'}\n"
            f"events_file={self.gpu_dir / 'events'}\n"
            "device_count=1\n"
            f"device.0.uuid={GPU_UUID}\n"
            f"device.0.memory_bytes={GPU_MEMORY}\n"
        )
        (self.gpu_dir / "events").write_text("")
        (self.work / "webhook").mkdir()

    def _install_agent_rbac(self) -> None:
        rbac = kubernetes.client.RbacAuthorizationV1Api(self.admin)
        for obj in rbac_objects("agent", WEBHOOK_NAMESPACE, service_account="fracgpu-agent"):
            create = {
                "ClusterRole": rbac.create_cluster_role,
                "ClusterRoleBinding": rbac.create_cluster_role_binding,
            }[obj["kind"]]
            try:
                create(obj)
            except ApiException as error:
                if error.status != 409:
                    raise

    # --- state ------------------------------------------------------------------------
    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.admin)

    def node(self) -> kubernetes.client.V1Node | None:
        try:
            return self.core.read_node(NODE_NAME)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def node_ready(self) -> bool:
        node = self.node()
        conditions = (node.status.conditions if node and node.status else None) or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    def wait_node_ready(self, timeout: float = 90) -> bool:
        return wait_for(self.node_ready, f"node {NODE_NAME} Ready", timeout, self.explain)

    def allocatable(self) -> dict[str, str]:
        node = self.node()
        return dict((node.status.allocatable if node and node.status else None) or {})

    def wait_gpu_allocatable(self, timeout: float = 60) -> dict[str, str]:
        def advertised() -> dict[str, str] | None:
            found = self.allocatable()
            cores = found.get("tencent.com/vcuda-core", "0")
            return found if cores not in ("0", "") else None

        return wait_for(advertised, "the agent's resources on the node", timeout, self.explain)

    def explain(self) -> str:
        """Log tails of the tier's processes, for a failing assertion."""
        parts = []
        for process in [
            *self.processes,
            *(p.process for p in (self.kubelet, self.containerd, self.agent) if p is not None),
        ]:
            parts.append(f"--- {process.name} ({process.log_path}):\n{process.log_tail(15)}")
        return "\n".join(parts)

    def registrations(self) -> int:
        """How many times the agent's plugins registered with kubelet so far."""
        assert self.agent is not None
        return sum(1 for e in self.agent.logs() if e.get("msg") == "registered with kubelet")

    def agent_metrics(self) -> dict[str, float]:
        """The agent's /metrics now: sample (name and labels, as exposed) -> value."""
        assert self.agent is not None
        ports = [e["port"] for e in self.agent.logs() if e.get("msg") == "metrics serving"]
        if not ports:
            raise AssertionError("the agent logged no metrics port")
        return scrape(ports[-1])

    def exec_in(self, container_id: str, *argv: str) -> str:
        """Run a command in a running container (through containerd, as `crictl exec` would)."""
        assert self.containerd is not None
        bare = container_id.split("://", 1)[-1]
        return self.containerd.ctr(
            "tasks", "exec", "--exec-id", f"t{time.monotonic_ns()}", bare, *argv
        )

    # --- faults -----------------------------------------------------------------------
    def restart_kubelet(self) -> None:
        assert self.kubelet is not None
        self.kubelet.stop()
        self.kubelet.start()
        self._sysctls.restore()

    def remove_node(self) -> None:
        """Node removal as an operator does it: kubelet stopped, the Node object deleted
        (its containers keep running until a kubelet comes back and finds them orphaned)."""
        assert self.kubelet is not None
        self.kubelet.stop()
        self.core.delete_node(NODE_NAME)
        wait_for(lambda: self.node() is None, f"node {NODE_NAME} deleted", 30)

    def restore_node(self) -> None:
        """kubelet started again: it registers the Node anew; the agent registers its plugins."""
        assert self.kubelet is not None
        self.kubelet.start()
        self._sysctls.restore()
        self.wait_node_ready()
        self.wait_gpu_allocatable()

    def set_gpu_fault(self, key: str, value: int | None) -> None:
        """Add (or with None remove) one line of the fake driver's configuration, e.g.
        `device.0.nvml_error.nvmlDeviceGetMemoryInfo=15` (GPU is lost); NVML users, the agent
        included, see it on their next call."""
        lines = [
            line
            for line in self.gpu_config.read_text().splitlines()
            if not line.startswith(f"{key}=")
        ]
        if value is not None:
            lines.append(f"{key}={value}")
        tmp = self.gpu_config.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, self.gpu_config)
        # The double notices a change by size or mtime: make every rewrite visibly newer.
        stamp = self.gpu_config.stat().st_mtime_ns + 1_000_000
        os.utime(self.gpu_config, ns=(stamp, stamp))

    def cordon(self, unschedulable: bool) -> None:
        self.core.patch_node(NODE_NAME, {"spec": {"unschedulable": unschedulable}})

    @contextlib.contextmanager
    def queue_mode(self) -> Iterator[None]:
        """The webhook in queue mode with the fracgpu scheduler calling its extender; put
        back to immediate mode (and the scheduler stopped) afterwards."""
        assert self.webhooks is not None
        (replica,) = self.webhooks.replicas
        port = free_port()
        # The stock kube-scheduler as fracgpu-scheduler, configured as the chart's sidecar.
        scheduler = fracgpu_scheduler(
            self.binaries.kube_scheduler,
            self.work / "fracgpu-scheduler",
            self.plane.kubeconfig("scheduler"),
            port,
            self.env,
        )
        self._restart_webhook(replica, ["--placement-mode=queue", f"--extender-port={port}"])
        self.processes.append(scheduler)
        try:
            scheduler.start()
            yield
        finally:
            scheduler.stop()
            self.processes.remove(scheduler)
            self._restart_webhook(replica, [])

    def _restart_webhook(self, replica: WebhookReplica, extra_args: list[str]) -> None:
        # the chart grants queue mode's pod writes only when it is on
        install_webhook_rbac(self.admin, queue=selects_queue_mode(extra_args))
        replica.stop()
        replica.extra_args = list(extra_args)
        replica.start()
        replica.wait_ready()
        wait_placing([replica])

    def restart_agent(self, *, crash: bool) -> None:
        """SIGTERM (or SIGKILL, as a crash) the agent and start it again."""
        assert self.agent is not None
        if crash:
            self.agent.kill()
        else:
            self.agent.stop()
        self.agent.start()

    # --- stop -------------------------------------------------------------------------
    def delete_all_pods(self, timeout: float = 60) -> None:
        """Delete every pod of the tests and wait until kubelet has torn them down."""
        core = self.core
        with contextlib.suppress(Exception):
            for pod in core.list_pod_for_all_namespaces().items:
                with contextlib.suppress(ApiException):
                    core.delete_namespaced_pod(
                        pod.metadata.name, pod.metadata.namespace, grace_period_seconds=1
                    )
            with contextlib.suppress(AssertionError):
                wait_for(
                    lambda: not core.list_pod_for_all_namespaces().items, "pods deleted", timeout
                )

    def close(self) -> None:
        if self.kubelet is not None and self.kubelet.process.running():
            self.delete_all_pods()
        for component in (self.agent, self.kubelet):
            if component is not None:
                component.stop()
        if self.containerd is not None:
            if self.containerd.process.running():
                self.containerd.remove_everything()
            self.containerd.stop()
        for process in reversed(self.processes):
            process.stop()
        self._stack.close()  # webhook, forwarder, namespace (kills leftovers), control plane
        self._unmount_leftovers()
        self._host_paths.restore()
        self._sysctls.restore()
        if not self.config.keep_logs:
            shutil.rmtree(self.work, ignore_errors=True)

    def _unmount_leftovers(self) -> None:
        prefix = str(self.work) + "/"
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for target in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)

    def __enter__(self) -> NodeTier:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def running_tier(
    binaries: NodeBinaries, plane_binaries: Binaries, config: E2EConfig
) -> Iterator[NodeTier]:
    with NodeTier(binaries, plane_binaries, config) as tier:
        yield tier


Json = dict[str, Any]
