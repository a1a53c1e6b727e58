"""kube-apiserver 1.20 on loopback, in front of the test etcd."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from .pki import ControlPlanePKI
from .ports import free_port
from .process import ManagedProcess

_START_TIMEOUT = 120.0
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"

# No controller-manager runs, so nothing would create the `default` ServiceAccount or its
# token: the ServiceAccount plugin would reject every pod. All webhook and quota plugins stay.
# ExtendedResourceToleration (on by default in some managed clusters) gives a pod asking for
# an extended resource a toleration of the taint of that name: the recipe in
# docs/operations.md for keeping GPU nodes for GPU pods relies on it.
ENABLED_ADMISSION_PLUGINS = (
    "NamespaceLifecycle",
    "LimitRanger",
    "DefaultTolerationSeconds",
    "Priority",
    "ExtendedResourceToleration",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "ResourceQuota",
)
DISABLED_ADMISSION_PLUGINS = ("ServiceAccount",)


class KubeApiserver:
    def __init__(
        self,
        *,
        binary: Path,
        work_dir: Path,
        pki: ControlPlanePKI,
        token_file: Path,
        etcd_url: str,
        probe_token: str,
        env: Mapping[str, str],
    ) -> None:
        self._binary = binary
        self._work_dir = work_dir
        self._pki = pki
        self._token_file = token_file
        self._etcd_url = etcd_url
        self._probe_token = probe_token
        self.port = free_port()
        self._process = ManagedProcess(
            "kube-apiserver", self._argv(), work_dir / "kube-apiserver.log", env
        )

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def process(self) -> ManagedProcess:
        return self._process

    def _argv(self) -> list[str]:
        pki = self._pki
        return [
            str(self._binary),
            "--advertise-address=127.0.0.1",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            # 1.20 still opens an unauthenticated port 8080 unless told not to.
            "--insecure-port=0",
            f"--cert-dir={self._work_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--token-auth-file={self._token_file}",
            "--anonymous-auth=false",
            "--authorization-mode=Node,RBAC",
            f"--enable-admission-plugins={','.join(ENABLED_ADMISSION_PLUGINS)}",
            f"--disable-admission-plugins={','.join(DISABLED_ADMISSION_PLUGINS)}",
            f"--etcd-servers={self._etcd_url}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--api-audiences=https://kubernetes.default.svc",
            # The `kubernetes` Endpoints would point at loopback, which validation refuses.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            # Alpha in 1.20: the pods/ephemeralcontainers subresource fracgpu's webhooks guard.
            "--feature-gates=EphemeralContainers=true",
            "--profiling=false",
            "--v=1",
        ]

    def ready(self) -> bool:
        context = ssl.create_default_context(cafile=str(self._pki.ca_cert))
        request = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {self._probe_token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                status: int = response.status
                answer: bytes = response.read()
        except (OSError, urllib.error.URLError):
            return False
        return status == 200 and answer.strip() == b"ok"

    def start(self) -> None:
        self._process.start()
        self.wait_ready()

    def wait_ready(self, timeout: float = _START_TIMEOUT) -> None:
        self._process.wait_until(self.ready, timeout, "ready (/readyz)")

    def stop(self) -> None:
        self._process.stop()

    def kill(self) -> None:
        self._process.kill()
