"""A TCP forwarder from the node namespace's loopback to the host's loopback, so kubelet
(inside) reaches the apiserver (outside) at https://127.0.0.1:<port> without any route
between the two: bytes are copied by this process, TLS passes through untouched."""

from __future__ import annotations

import contextlib
import socket
import threading

from .netns import NetworkNamespace


class Forwarder:
    def __init__(self, netns: NetworkNamespace, port: int) -> None:
        self.port = port
        self._stop = threading.Event()
        self._listener: socket.socket = netns.call_inside(self._listen)
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="node-forward")
        self._thread.start()

    def _listen(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        sock.settimeout(0.5)
        return sock

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                inner, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                outer = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                inner.close()
                continue
            outer.settimeout(None)
            inner.settimeout(None)
            with self._lock:
                self._conns += [inner, outer]
            for src, dst in ((inner, outer), (outer, inner)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(5)
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.close()
            self._conns.clear()
