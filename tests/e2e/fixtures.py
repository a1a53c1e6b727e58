"""Fixtures for tests on a real etcd + kube-apiserver (see harness/).

Registered once for the whole suite by tests/conftest.py, so every directory's end-to-end
tests (e2e, certs, chart, kubectl, agent) share one control plane per session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from .harness import (
    ControlPlane,
    E2EConfig,
    apply_crds,
    create_gpunode,
    create_namespace,
    create_node,
    fake_devices,
    gpu_allocatable,
    require_binaries,
)
from .harness.resources import FRACGPU_GROUP, FRACGPU_VERSION
from .webhook_harness import Webhooks, running_webhooks


@pytest.fixture(scope="session")
def e2e_config() -> E2EConfig:
    return E2EConfig.from_env()


@pytest.fixture(scope="session")
def control_plane(e2e_config: E2EConfig) -> Iterator[ControlPlane]:
    """A started etcd + kube-apiserver shared by the session; stopped and removed at the end."""
    binaries = require_binaries(e2e_config)
    plane = ControlPlane(binaries, e2e_config)
    try:
        plane.start()
    except BaseException:
        plane.close()
        raise
    yield plane
    plane.close()


@pytest.fixture(autouse=True)
def _control_plane_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    # Fault tests stop and kill pieces; if one fails half-way the next test still gets a
    # working control plane.
    yield
    if "control_plane" in request.fixturenames:
        plane: ControlPlane = request.getfixturevalue("control_plane")
        plane.ensure_running()


@pytest.fixture(scope="session")
def kube_client(control_plane: ControlPlane) -> kubernetes.client.ApiClient:
    """kubernetes.client.ApiClient authenticated as the admin (system:masters)."""
    return control_plane.api_client("admin")


@pytest.fixture(scope="session")
def kubeconfig(control_plane: ControlPlane) -> Path:
    """Path of an admin kubeconfig (other identities: control_plane.kubeconfig(key))."""
    return control_plane.kubeconfig("admin")


@pytest.fixture(scope="session")
def fracgpu_crds(kube_client: kubernetes.client.ApiClient) -> list[str]:
    """The chart's CRDs, applied and served; yields their names."""
    return apply_crds(kube_client)


@pytest.fixture
def namespace(control_plane: ControlPlane, kube_client: kubernetes.client.ApiClient) -> str:
    """A fresh namespace in which the `tenant` identity has the built-in `edit` role."""
    return create_namespace(kube_client, editors=[control_plane.identity("tenant").user])


@dataclass(frozen=True)
class GPUNodeInfo:
    name: str
    devices: list[dict[str, Any]]


class NodeFactory:
    """Creates Node (and GPUNode) objects and deletes them when the test ends."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self._client = client
        self._nodes: list[str] = []
        self._gpunodes: list[str] = []

    def node(self, name: str, **kwargs: Any) -> kubernetes.client.V1Node:
        """A plain Node; keyword arguments as harness.create_node."""
        node = create_node(self._client, name, **kwargs)
        self._nodes.append(name)
        return node

    def gpu_node(
        self,
        name: str,
        *,
        gpus: int = 8,
        model: str = "NVIDIA A100-SXM4-40GB",
        memory_mib: int = 40960,
        spec: dict[str, Any] | None = None,
        labels: dict[str, str] | None = None,
    ) -> GPUNodeInfo:
        """A Node with canonical GPU allocatable plus its GPUNode inventory (needs the CRDs)."""
        self.node(name, extended=gpu_allocatable(gpus, memory_mib), labels=labels)
        devices = fake_devices(name, gpus, model=model, memory_mib=memory_mib)
        create_gpunode(self._client, name, devices, spec=spec)
        self._gpunodes.append(name)
        return GPUNodeInfo(name=name, devices=devices)

    def cleanup(self) -> None:
        core = kubernetes.client.CoreV1Api(self._client)
        custom = kubernetes.client.CustomObjectsApi(self._client)
        for name in self._gpunodes:
            _ignore_missing(
                custom.delete_cluster_custom_object,
                FRACGPU_GROUP,
                FRACGPU_VERSION,
                "gpunodes",
                name,
            )
        for name in self._nodes:
            _ignore_missing(core.delete_node, name)


def _ignore_missing(delete: Callable[..., object], *args: str) -> None:
    try:
        delete(*args)
    except ApiException as error:
        if error.status != 404:
            raise


@pytest.fixture
def nodes(
    kube_client: kubernetes.client.ApiClient, fracgpu_crds: list[str]
) -> Iterator[NodeFactory]:
    """Factory for Node/GPUNode objects, removed after the test."""
    factory = NodeFactory(kube_client)
    yield factory
    factory.cleanup()


@pytest.fixture(scope="module")
def one_webhook(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Webhooks]:
    """One `fracgpu serve` replica in cluster mode with default settings, registered with the
    chart's webhook configurations and running as fracgpu's service account (chart RBAC)."""
    with running_webhooks(
        kube_client,
        control_plane.kubeconfig("webhook"),
        tmp_path_factory.mktemp("webhooks"),
        [],
        replicas=1,
    ) as running:
        yield running
