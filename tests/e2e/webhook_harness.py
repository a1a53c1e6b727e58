"""Real webhook replicas behind a loopback TCP balancer, registered with the API server.

The API server calls one URL per webhook; a round-robin TCP balancer in front of the
replicas (TLS passes through untouched) spreads its connections over both, and a killed
replica simply stops answering there, as behind a Service.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from tests.chart.chartfiles import rbac_objects, webhook_configurations
from tests.e2e.harness.kube import body as harness_body
from webhook.cli import selfsigned

ROOT = Path(__file__).resolve().parents[2]
FRACGPU = Path(sys.executable).with_name("fracgpu")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class WebhookTLS:
    ca_pem: bytes
    cert_file: Path
    key_file: Path
    ca_file: Path

    @classmethod
    def create(cls, directory: Path) -> WebhookTLS:
        authority = selfsigned.new_authority()
        ca, cert, key = selfsigned.write_files(
            directory, authority, selfsigned.issue_serving(authority)
        )
        return cls(authority.cert_pem, cert, key, ca)


class TcpBalancer:
    """Round-robin TCP proxy on 127.0.0.1, in its own thread; skips backends that refuse."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = list(backends)
        self.port = free_port()
        self.connections = dict.fromkeys(backends, 0)
        self._cycle = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> TcpBalancer:
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.call_later(0.2, self._loop.stop)

        self._loop.call_soon_threadsafe(close)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = None
        for _ in range(len(self.backends)):
            port = self.backends[next(self._cycle) % len(self.backends)]
            with contextlib.suppress(OSError):
                upstream = await asyncio.open_connection("127.0.0.1", port)
                self.connections[port] += 1
                break
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@dataclass
class WebhookReplica:
    """One `fracgpu serve` process in cluster mode."""

    name: str
    kubeconfig: Path
    tls: WebhookTLS
    log_dir: Path
    extra_args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> WebhookReplica:
        args = [
            str(FRACGPU), "serve",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--tls-cert-file", str(self.tls.cert_file),
            "--tls-key-file", str(self.tls.key_file),
            "--kubeconfig", str(self.kubeconfig),
            "--identity", self.name,
            "--lease-namespace", FRACGPU_NAMESPACE,
            "--controller-interval-seconds", "1",
            "--settle-seconds", "2",
            # A replica killed while leading is succeeded within seconds, not half a minute.
            "--takeover-grace-seconds", "3",
            # Below the short reservation TTLs the tests use (the window must end first).
            "--admission-window-seconds", "10",
            *self.extra_args,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with (self.log_dir / f"{self.name}.log").open("ab") as log:
            # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self

    def wait_ready(self, timeout_s: float = 30) -> None:
        context = ssl.create_default_context(cafile=str(self.tls.ca_file))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{self.port}/readyz", context=context, timeout=2
                ) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.name} never became ready: {self.log_tail()}")

    def metric(self, sample: str) -> float:
        """The value of one sample (name and labels, as exposed) on this replica's /metrics;
        0 when absent."""
        context = ssl.create_default_context(cafile=str(self.tls.ca_file))
        with urllib.request.urlopen(
            f"https://127.0.0.1:{self.port}/metrics", context=context, timeout=5
        ) as response:
            text = response.read().decode()
        return sum(
            float(line.split()[-1]) for line in text.splitlines() if line.split(" ")[0] == sample
        )

    def admissions(self, endpoint: str, verdict: str) -> float:
        """This replica's count of admissions on ``endpoint`` answered ``verdict``."""
        return self.metric(
            f'fracgpu_webhook_admissions_total{{endpoint="{endpoint}",verdict="{verdict}"}}'
        )

    def placing(self) -> bool:
        """Whether this replica places GPU pods now (it leads, past its takeover wait)."""
        try:
            return self.metric("fracgpu_webhook_placing") == 1.0
        except OSError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def rss_bytes(self) -> int:
        """Resident memory of the replica process now."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS line")

    def log_tail(self, lines: int = 30) -> str:
        path = self.log_dir / f"{self.name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_placing(replicas: list[WebhookReplica], timeout_s: float = 60) -> None:
    """Until one replica places GPU pods: a new leader waits after taking the Lease over."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [r for r in replicas if r.process is not None and r.process.poll() is None]
        if any(r.placing() for r in alive):
            return
        time.sleep(0.2)
    raise AssertionError(
        "no replica places GPU pods: " + "; ".join(r.log_tail(5) for r in replicas)
    )


MUTATING = "fracgpu-mutate"
VALIDATING = "fracgpu-validate"


FRACGPU_NAMESPACE = "fracgpu-system"


def install_webhook_rbac(client: kubernetes.client.ApiClient, *, queue: bool = False) -> None:
    """fracgpu's namespace plus the chart's own RBAC objects for the webhook (``queue``: as
    in queue mode; immediate mode is not granted the queue's pod writes)."""
    core = kubernetes.client.CoreV1Api(client)
    with contextlib.suppress(ApiException):
        # 1.20 has no kubernetes.io/metadata.name label: exempt by fracgpu's own label
        core.create_namespace(
            harness_body(
                {"metadata": {"name": FRACGPU_NAMESPACE, "labels": {"fracgpu.io/ignore": "true"}}}
            )
        )
    rbac = kubernetes.client.RbacAuthorizationV1Api(client)
    for obj in rbac_objects("webhook", FRACGPU_NAMESPACE, queue=queue):
        kind, payload = obj["kind"], harness_body(obj)
        name = obj["metadata"]["name"]
        try:
            if kind == "ClusterRole":
                rbac.create_cluster_role(payload)
            elif kind == "ClusterRoleBinding":
                rbac.create_cluster_role_binding(payload)
            elif kind == "Role":
                rbac.create_namespaced_role(FRACGPU_NAMESPACE, payload)
            else:
                rbac.create_namespaced_role_binding(FRACGPU_NAMESPACE, payload)
        except ApiException as error:
            if error.status != 409:
                raise
            # An earlier test's mode may have left other rules: this mode's replace them.
            if kind == "ClusterRole":
                rbac.replace_cluster_role(name, payload)
            elif kind == "Role":
                rbac.replace_namespaced_role(name, FRACGPU_NAMESPACE, payload)


def selects_queue_mode(args: Sequence[str]) -> bool:
    """Whether webhook arguments ``args`` select queue mode."""
    pairs = itertools.pairwise(args)  # each argument with the next
    return "--placement-mode=queue" in args or ("--placement-mode", "queue") in pairs


def register_webhooks(client: kubernetes.client.ApiClient, url: str, ca_pem: bytes) -> None:
    api = kubernetes.client.AdmissionregistrationV1Api(client)
    mutating, validating = webhook_configurations(url=url, ca_bundle=ca_pem)
    for create, delete, config in (
        (api.create_mutating_webhook_configuration,
         api.delete_mutating_webhook_configuration, mutating),
        (api.create_validating_webhook_configuration,
         api.delete_validating_webhook_configuration, validating),
    ):  # fmt: skip
        with contextlib.suppress(ApiException):
            delete(config["metadata"]["name"])
        create(harness_body(config))


class Webhooks:
    """Running replicas, the balancer in front of them, and the URL the API server calls."""

    def __init__(self, replicas: list[WebhookReplica], balancer: TcpBalancer) -> None:
        self.replicas = replicas
        self.balancer = balancer


@contextlib.contextmanager
def running_webhooks(
    kube_client: kubernetes.client.ApiClient,
    kubeconfig: Path,
    work: Path,
    extra_args: list[str],
    replicas: int = 2,
    per_replica: Callable[[int], list[str]] | None = None,
) -> Iterator[Webhooks]:
    """Replicas in cluster mode (as the webhook's service account, with the chart's RBAC)
    behind a balancer, registered with the chart's webhook configurations; ``per_replica``
    adds arguments of replica i's own (its extender port)."""
    install_webhook_rbac(kube_client, queue=selects_queue_mode(extra_args))
    tls = WebhookTLS.create(work / "tls")
    started = [
        WebhookReplica(
            f"replica-{i}",
            kubeconfig,
            tls,
            work,
            [*extra_args, *(per_replica(i) if per_replica is not None else [])],
        ).start()
        for i in range(replicas)
    ]
    try:
        for replica in started:
            replica.wait_ready()
        wait_placing(started)
        with TcpBalancer([r.port for r in started]) as balancer:
            url = f"https://127.0.0.1:{balancer.port}"
            register_webhooks(kube_client, url, tls.ca_pem)
            try:
                yield Webhooks(started, balancer)
            finally:
                unregister_webhooks(kube_client, url, tls.ca_pem)
    finally:
        for replica in started:
            replica.stop()


def unregister_webhooks(client: kubernetes.client.ApiClient, url: str, ca_pem: bytes) -> None:
    api = kubernetes.client.AdmissionregistrationV1Api(client)
    mutating, validating = webhook_configurations(url=url, ca_bundle=ca_pem)
    with contextlib.suppress(ApiException):
        api.delete_mutating_webhook_configuration(mutating["metadata"]["name"])
    with contextlib.suppress(ApiException):
        api.delete_validating_webhook_configuration(validating["metadata"]["name"])
