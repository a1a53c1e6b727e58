"""Serve the device plugins on unix sockets, register them with kubelet, and keep them
registered: when kubelet restarts it recreates its socket and deletes ours, so a watcher
notices either change and starts the plugins afresh and registers them again.
"""

import logging
import os
import threading
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from agent.deviceplugin.plugin import DevicePlugin
from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2 as pb
from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from agent.deviceplugin.state import DeviceState

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


class RegistrationError(Exception):
    """Kubelet refused or could not be reached; says which resource and why."""


def socket_name(resource_name: str) -> str:
    """fracgpu-<resource>.sock, e.g. fracgpu-vcuda-core.sock."""
    return f"fracgpu-{resource_name.rsplit('/', 1)[-1]}.sock"


@dataclass(frozen=True)
class _SocketId:
    inode: int
    ctime_ns: int


def _socket_id(path: Path) -> _SocketId | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return _SocketId(st.st_ino, st.st_ctime_ns)


class PluginServer:
    """One plugin's gRPC server on <plugin dir>/<socket name>."""

    def __init__(self, plugin: DevicePlugin, plugin_dir: Path) -> None:
        self.plugin = plugin
        self.socket = plugin_dir / socket_name(plugin.resource_name)
        self._server: grpc.Server | None = None
        self.socket_id: _SocketId | None = None

    def start(self) -> None:
        self.stop()
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="dp"))
        pb_grpc.add_DevicePluginServicer_to_server(self.plugin, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        self.socket_id = _socket_id(self.socket)
        log.info("device plugin serving", extra={"socket": str(self.socket)})

    def register(self, kubelet_socket: Path, timeout: float = 5.0) -> None:
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket.name,
            resource_name=self.plugin.resource_name,
            options=pb.DevicePluginOptions(
                pre_start_required=True, get_preferred_allocation_available=True
            ),
        )
        try:
            with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
                pb_grpc.RegistrationStub(channel).Register(request, timeout=timeout)
        except grpc.RpcError as error:
            raise RegistrationError(
                f"registering {self.plugin.resource_name} with kubelet at {kubelet_socket} "
                f"failed: {error.code().name}: {error.details()}"
            ) from None
        log.info("registered with kubelet", extra={"resource": self.plugin.resource_name})

    def socket_intact(self) -> bool:
        return self._server is not None and _socket_id(self.socket) == self.socket_id

    def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self.plugin.end_streams()
            self._server.stop(grace).wait()
            self._server = None
            if _socket_id(self.socket) == self.socket_id:
                self.socket.unlink(missing_ok=True)


class PluginManager:
    """Runs the plugins and re-registers them whenever kubelet restarts."""

    def __init__(
        self,
        plugins: Sequence[DevicePlugin],
        state: DeviceState,
        plugin_dir: Path,
        poll_seconds: float,
    ) -> None:
        self.servers = [PluginServer(p, plugin_dir) for p in plugins]
        self._state = state
        self._kubelet_socket = plugin_dir / KUBELET_SOCKET
        self._poll = poll_seconds
        self._registered_with: _SocketId | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registrations = 0  # how many times all plugins registered (for tests and logs)
        # Why the plugins are not registered now ("" once they are); logged when it changes.
        self._problem = "not checked kubelet's socket yet"
        self._lock = threading.Lock()

    def readiness(self) -> tuple[bool, str]:
        """(registered with kubelet, why not / with which kubelet socket) for /readyz."""
        with self._lock:
            problem = self._problem
        if problem:
            return False, problem
        return True, f"device plugins registered with kubelet at {self._kubelet_socket}"

    def _set_problem(self, problem: str) -> None:
        with self._lock:
            changed, self._problem = problem != self._problem, problem
        if changed and problem:
            log.warning("not ready", extra={"reason": problem})

    def sync_once(self) -> bool:
        """Start and register whatever needs it; True when all plugins are registered."""
        kubelet = _socket_id(self._kubelet_socket)
        if kubelet is None:
            self._registered_with = None
            self._set_problem(
                f"kubelet's device-plugin socket {self._kubelet_socket} does not exist: is "
                "kubelet running, and is --device-plugin-dir the directory kubelet uses "
                "(mounted from the host)? No GPU is advertised until it appears"
            )
            return False
        restart = kubelet != self._registered_with or not all(
            s.socket_intact() for s in self.servers
        )
        if not restart:
            return True
        try:
            for server in self.servers:
                server.start()
                server.register(self._kubelet_socket)
        except (RegistrationError, OSError, RuntimeError) as error:
            log.warning(
                "device plugin registration failed; will retry", extra={"error": str(error)}
            )
            self._registered_with = None
            self._set_problem(f"device plugin registration failed: {error}")
            return False
        self._registered_with = kubelet
        self._set_problem("")
        self.registrations += 1
        return True

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="kubelet-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sync_once()
            self._stop.wait(self._poll)

    def stop(self) -> None:
        """Stop watching, close the streams and remove our sockets (kubelet then drops us)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._state.wake()
        for server in self.servers:
            server.stop()
        log.info("device plugins stopped", extra={"pid": os.getpid()})
