"""etcd + kube-apiserver as one unit: start, stop, restart pieces, hand out clients."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

import kubernetes.client

from .apiserver import KubeApiserver
from .binaries import Binaries
from .config import E2EConfig
from .etcd import Etcd
from .identities import Identity, default_identities, token_file
from .kubeconfig import write_kubeconfig
from .pki import ControlPlanePKI, generate_pki
from .process import ProcessFailedError

_START_ATTEMPTS = 3
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def _child_environment() -> dict[str, str]:
    # Everything the control plane talks to is on loopback: never route it via a proxy.
    return {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARIABLES}


class ControlPlane:
    """A running etcd and kube-apiserver in a private temp dir; `close()` leaves nothing."""

    def __init__(
        self, binaries: Binaries, config: E2EConfig, extra_identities: Iterable[Identity] = ()
    ) -> None:
        """`extra_identities`: users beyond the defaults (the node tier's kubelet, scheduler
        and controller-manager)."""
        self._binaries = binaries
        self._config = config
        self.work_dir = Path(tempfile.mkdtemp(prefix="fracgpu-e2e-", dir=config.scratch_dir))
        self._env = _child_environment()
        self._identities = {i.key: i for i in (*default_identities(), *extra_identities)}
        self.pki: ControlPlanePKI = generate_pki(self.work_dir / "pki")
        self._token_file = self.work_dir / "tokens.csv"
        self._token_file.write_text(token_file(self._identities.values()))
        self._token_file.chmod(0o600)
        self._clients: list[kubernetes.client.ApiClient] = []
        self._etcd: Etcd | None = None
        self._apiserver: KubeApiserver | None = None

    # --- lifecycle --------------------------------------------------------------------
    def start(self) -> ControlPlane:
        for attempt in range(1, _START_ATTEMPTS + 1):
            self._etcd = Etcd(self._binaries.etcd, self.work_dir, self._env)
            self._apiserver = KubeApiserver(
                binary=self._binaries.kube_apiserver,
                work_dir=self.work_dir,
                pki=self.pki,
                token_file=self._token_file,
                etcd_url=self._etcd.url,
                probe_token=self.identity("admin").token,
                env=self._env,
            )
            try:
                self._etcd.start()
                self._apiserver.start()
            except ProcessFailedError as error:
                self._stop_processes()
                # A port picked as free can be taken before the child binds it: retry.
                if "address already in use" in str(error) and attempt < _START_ATTEMPTS:
                    shutil.rmtree(self._etcd.data_dir, ignore_errors=True)
                    continue
                raise
            break
        self._write_kubeconfigs()
        return self

    def close(self) -> None:
        for client in self._clients:
            client.close()  # type: ignore[no-untyped-call]
        self._clients.clear()
        self._stop_processes()
        if not self._config.keep_logs:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _stop_processes(self) -> None:
        if self._apiserver is not None:
            self._apiserver.stop()
        if self._etcd is not None:
            self._etcd.stop()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- pieces -----------------------------------------------------------------------
    @property
    def etcd(self) -> Etcd:
        if self._etcd is None:
            raise RuntimeError("control plane not started")
        return self._etcd

    @property
    def apiserver(self) -> KubeApiserver:
        if self._apiserver is None:
            raise RuntimeError("control plane not started")
        return self._apiserver

    @property
    def url(self) -> str:
        return self.apiserver.url

    @property
    def ca_cert(self) -> Path:
        return self.pki.ca_cert

    def pids(self) -> list[int]:
        """PIDs of the running control-plane processes (for leak checks)."""
        procs = [p.process for p in (self._etcd, self._apiserver) if p is not None]
        return [p.pid for p in procs if p.running() and p.pid is not None]

    # --- faults -----------------------------------------------------------------------
    def stop_apiserver(self) -> None:
        self.apiserver.stop()

    def kill_apiserver(self) -> None:
        self.apiserver.kill()

    def start_apiserver(self) -> None:
        """Start again on the same port and wait for /readyz."""
        self.apiserver.start()

    def restart_apiserver(self) -> None:
        self.apiserver.stop()
        self.apiserver.start()

    def stop_etcd(self) -> None:
        self.etcd.stop()

    def kill_etcd(self) -> None:
        self.etcd.kill()

    def start_etcd(self) -> None:
        """Start etcd on the same ports and data, then wait until the apiserver is ready."""
        self.etcd.start()
        if self.apiserver.process.running():
            self.apiserver.wait_ready()

    def restart_etcd(self) -> None:
        self.etcd.stop()
        self.start_etcd()

    def ensure_running(self) -> None:
        """Bring back whatever a test left stopped, so one failure does not cascade."""
        if not self.etcd.process.running():
            self.etcd.start()
        if not self.apiserver.process.running():
            self.apiserver.start()
        else:
            self.apiserver.wait_ready()

    # --- identities and clients ------------------------------------------------------
    def identity(self, key: str) -> Identity:
        try:
            return self._identities[key]
        except KeyError:
            known = ", ".join(sorted(self._identities))
            raise KeyError(f"unknown identity {key!r}; known: {known}") from None

    def configuration(
        self, key: str = "admin", pool_size: int = 16
    ) -> kubernetes.client.Configuration:
        configuration = kubernetes.client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = str(self.ca_cert)
        configuration.verify_ssl = True
        configuration.api_key = {"BearerToken": self.identity(key).token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        configuration.connection_pool_maxsize = pool_size
        return configuration

    def api_client(self, key: str = "admin", pool_size: int = 16) -> kubernetes.client.ApiClient:
        """A client authenticated as `key`; closed by `close()`."""
        client = kubernetes.client.ApiClient(self.configuration(key, pool_size))
        self._clients.append(client)
        return client

    def kubeconfig(self, key: str = "admin") -> Path:
        """A kubeconfig holding only `key`'s credentials (for a process under test)."""
        return self.work_dir / f"kubeconfig-{key}.yaml"

    @property
    def kubeconfig_all(self) -> Path:
        """One kubeconfig with a context per identity, current context `admin`."""
        return self.work_dir / "kubeconfig.yaml"

    def _write_kubeconfigs(self) -> None:
        identities = list(self._identities.values())
        write_kubeconfig(self.kubeconfig_all, self.url, self.ca_cert, identities, "admin")
        for identity in identities:
            write_kubeconfig(
                self.kubeconfig(identity.key), self.url, self.ca_cert, [identity], identity.key
            )
