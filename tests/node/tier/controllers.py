"""kube-scheduler and kube-controller-manager 1.20 on the host's loopback, talking to the
tier's apiserver under their own built-in identities (system:kube-scheduler,
system:kube-controller-manager), which the apiserver's default RBAC already binds."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.e2e.harness.pki import ControlPlanePKI
from tests.e2e.harness.ports import free_port
from tests.e2e.harness.process import ManagedProcess


def scheduler(binary: Path, work: Path, kubeconfig: Path, env: Mapping[str, str]) -> ManagedProcess:
    return ManagedProcess(
        "kube-scheduler",
        [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--port=0",
            f"--cert-dir={work / 'scheduler-certs'}",
            "--v=2",
        ],
        work / "kube-scheduler.log",
        env,
    )


def controller_manager(
    binary: Path, work: Path, kubeconfig: Path, pki: ControlPlanePKI, env: Mapping[str, str]
) -> ManagedProcess:
    return ManagedProcess(
        "kube-controller-manager",
        [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            # Each controller under its own service account, with its built-in role (as kubeadm).
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.service_account_key}",
            f"--root-ca-file={pki.ca_cert}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--port=0",
            f"--cert-dir={work / 'cm-certs'}",
            # Node lifecycle: a stopped kubelet is noticed, but pods are not evicted within
            # the tests' lifetime.
            "--node-monitor-grace-period=40s",
            "--pod-eviction-timeout=5m",
            "--controllers=*,-bootstrapsigner,-tokencleaner,-csrsigning,-csrapproving,-cloud-node-lifecycle,-route,-service",
            "--v=1",
        ],
        work / "kube-controller-manager.log",
        env,
    )
