"""A single-member etcd on loopback with its own data directory."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from .ports import free_port
from .process import ManagedProcess

_START_TIMEOUT = 30.0


class Etcd:
    def __init__(self, binary: Path, work_dir: Path, env: Mapping[str, str]) -> None:
        self._binary = binary
        self.data_dir = work_dir / "etcd-data"
        self.client_port = free_port()
        self.peer_port = free_port()
        self._process = ManagedProcess("etcd", self._argv(), work_dir / "etcd.log", env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def process(self) -> ManagedProcess:
        return self._process

    def _argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            str(self._binary),
            "--name=e2e",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=e2e={peer}",
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-outputs=stderr",
            "--log-level=warn",
        ]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                body = json.loads(response.read())
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return isinstance(body, dict) and body.get("health") == "true"

    def start(self) -> None:
        self._process.start()
        self._process.wait_until(self.healthy, _START_TIMEOUT, "healthy")

    def stop(self) -> None:
        self._process.stop()

    def kill(self) -> None:
        self._process.kill()
