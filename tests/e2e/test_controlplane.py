"""The end-to-end harness itself: a real apiserver, the chart's CRDs, restarts, cleanup."""

from __future__ import annotations

import json
import os
import ssl
import urllib.request
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import pytest
from kubernetes.client.exceptions import ApiException

from fracgpu import codec
from fracgpu.model import GPUAllocation, Quota, Reservation, ResourceAmounts, ResourceLimits

from .fixtures import NodeFactory
from .harness import (
    ControlPlane,
    E2EConfig,
    MissingBinaryError,
    create_resource_quota,
    locate_binaries,
    require_binaries,
)
from .harness.kube import as_dict, body
from .harness.resources import CORE_RESOURCE, FRACGPU_GROUP, FRACGPU_VERSION

pytestmark = pytest.mark.e2e

GPUNODES = "gpunodes.fracgpu.io"
GPUQUOTAS = "gpuquotas.fracgpu.io"


def _table(plane: ControlPlane, path: str) -> dict[str, Any]:
    """What `kubectl get` asks for: the server-side Table built from the printer columns."""
    request = urllib.request.Request(
        f"{plane.url}{path}",
        headers={
            "Authorization": f"Bearer {plane.identity('admin').token}",
            "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io",
        },
    )
    context = ssl.create_default_context(cafile=str(plane.ca_cert))
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        table: dict[str, Any] = json.loads(response.read())
    return table


def _cells(table: dict[str, Any], row_name: str) -> dict[str, Any]:
    names = [c["name"] for c in table["columnDefinitions"]]
    for row in table["rows"]:
        if row["object"]["metadata"]["name"] == row_name:
            return dict(zip(names, row["cells"], strict=True))
    raise AssertionError(f"no row {row_name!r} in {table['rows']}")


def _config_map(client: kubernetes.client.ApiClient, namespace: str, value: str) -> str:
    name = f"cm-{uuid.uuid4().hex[:6]}"
    kubernetes.client.CoreV1Api(client).create_namespaced_config_map(
        namespace, body({"metadata": {"name": name}, "data": {"value": value}})
    )
    return name


def _read_config_map(client: kubernetes.client.ApiClient, namespace: str, name: str) -> str:
    data = kubernetes.client.CoreV1Api(client).read_namespaced_config_map(name, namespace).data
    assert data is not None
    return data["value"]


def _custom(client: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(client)


# --- binaries -------------------------------------------------------------------------


def test_missing_apiserver_names_the_build_script_and_fails_in_ci(tmp_path: Path) -> None:
    absent = tmp_path / "kube-apiserver"
    ci = E2EConfig(in_ci=True, kube_apiserver=absent, etcd=None, scratch_dir=None, keep_logs=False)
    with pytest.raises(MissingBinaryError, match=r"scripts/build-kube-apiserver\.sh"):
        locate_binaries(ci)
    with pytest.raises(pytest.fail.Exception, match=r"scripts/build-kube-apiserver\.sh"):
        require_binaries(ci)
    local = E2EConfig(
        in_ci=False, kube_apiserver=absent, etcd=None, scratch_dir=None, keep_logs=False
    )
    with pytest.raises(pytest.skip.Exception, match=r"scripts/build-kube-apiserver\.sh"):
        require_binaries(local)


# --- the apiserver --------------------------------------------------------------------


def test_apiserver_is_kubernetes_1_20_and_serves_admin(
    kube_client: kubernetes.client.ApiClient,
) -> None:
    version = kubernetes.client.VersionApi(kube_client).get_code()
    assert version.git_version == "v1.20.2"
    names = {
        ns.metadata.name if ns.metadata else None
        for ns in kubernetes.client.CoreV1Api(kube_client).list_namespace().items
    }
    assert {"default", "kube-system"} <= names


def test_rbac_applies_to_non_admin_identities(control_plane: ControlPlane) -> None:
    # Identities that no test binds cluster-wide (the session's control plane is shared:
    # the webhook and agent accounts get the chart's RBAC in other tests).
    for key in ("tenant", "tenant2"):
        api = kubernetes.client.CoreV1Api(control_plane.api_client(key))
        with pytest.raises(ApiException) as denied:
            api.list_node()
        assert denied.value.status == 403
        assert control_plane.identity(key).user in str(denied.value.body)


def test_tenant_may_edit_its_namespace_only(
    control_plane: ControlPlane, namespace: str, kube_client: kubernetes.client.ApiClient
) -> None:
    tenant = control_plane.api_client("tenant")
    name = _config_map(tenant, namespace, "mine")
    assert _read_config_map(kube_client, namespace, name) == "mine"
    with pytest.raises(ApiException) as denied:
        _config_map(tenant, "default", "not mine")
    assert denied.value.status == 403


def test_kubeconfig_files_authenticate_each_identity(control_plane: ControlPlane) -> None:
    new_client = kubernetes.config.new_client_from_config
    admin = new_client(config_file=str(control_plane.kubeconfig_all))  # type: ignore[no-untyped-call]
    tenant = new_client(config_file=str(control_plane.kubeconfig("tenant")))  # type: ignore[no-untyped-call]
    try:
        assert kubernetes.client.CoreV1Api(admin).list_node() is not None
        with pytest.raises(ApiException) as denied:
            kubernetes.client.CoreV1Api(tenant).list_node()
        assert "tenant-alice" in str(denied.value.body)
    finally:
        admin.close()
        tenant.close()


def test_resource_quota_on_canonical_resources_is_enforced(
    kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    create_resource_quota(kube_client, namespace, {f"requests.{CORE_RESOURCE}": "100"})
    core = kubernetes.client.CoreV1Api(kube_client)

    def pod(name: str, cores: int) -> dict[str, Any]:
        limits = {CORE_RESOURCE: str(cores)}
        return {
            "metadata": {"name": name},
            "spec": {
                "containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}]
            },
        }

    core.create_namespaced_pod(namespace, body(pod("fits", 60)))
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, body(pod("too-big", 60)))
    assert refused.value.status == 403
    assert "exceeded quota" in str(refused.value.body)
    status = core.read_namespaced_resource_quota("e2e", namespace).status
    assert status is not None
    assert status.used is not None
    assert status.used[f"requests.{CORE_RESOURCE}"] == "60"


# --- nodes ----------------------------------------------------------------------------


def test_node_objects_carry_gpu_allocatable(
    nodes: NodeFactory, kube_client: kubernetes.client.ApiClient
) -> None:
    info = nodes.gpu_node("gpu-node-a", gpus=4, memory_mib=16384)
    status = kubernetes.client.CoreV1Api(kube_client).read_node("gpu-node-a").status
    assert status is not None
    assert status.allocatable is not None
    assert status.allocatable[CORE_RESOURCE] == "400"
    assert status.allocatable["tencent.com/vcuda-memory"] == str(4 * 16384 // 256)
    assert {c.type: c.status for c in status.conditions or []}["Ready"] == "True"
    gpunode = as_dict(
        _custom(kube_client).get_cluster_custom_object(
            FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", "gpu-node-a"
        )
    )
    assert [d["uuid"] for d in gpunode["status"]["devices"]] == [d["uuid"] for d in info.devices]
    assert len({d["uuid"] for d in info.devices}) == 4


# --- CRDs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("crd", "scope", "columns"),
    [
        (GPUNODES, "Cluster", ["GPUs", "Model", "Compute", "Memory(MiB)"]),
        (
            GPUQUOTAS,
            "Namespaced",
            ["Used-Cores", "Hard-Cores", "Used-MiB", "Hard-MiB", "Used-GPUs", "Hard-GPUs"],
        ),
    ],
)
def test_crds_are_established_with_status_subresource_and_columns(
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    crd: str,
    scope: str,
    columns: list[str],
) -> None:
    assert crd in fracgpu_crds
    definition = kubernetes.client.ApiextensionsV1Api(kube_client).read_custom_resource_definition(
        crd
    )
    assert definition.status is not None
    conditions = {c.type: c.status for c in definition.status.conditions or []}
    assert conditions["Established"] == "True"
    assert definition.spec.scope == scope
    (version,) = definition.spec.versions
    assert version.name == "v1alpha1"
    assert version.subresources is not None
    assert version.subresources.status is not None
    columns_read = version.additional_printer_columns or []
    printed = [c.name for c in columns_read if not c.priority]
    assert printed[: len(columns)] == columns


def _gpunode(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fracgpu.io/v1alpha1",
        "kind": "GPUNode",
        "metadata": {"name": name},
        "spec": spec,
    }


def _gpuquota(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "fracgpu.io/v1alpha1",
        "kind": "GPUQuota",
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"hard": {"cores": -1}}, "spec.hard.cores"),
        ({"hard": {"memoryMiB": "lots"}}, "spec.hard.memoryMiB"),
        ({"hard": {"gpus": -2}}, "spec.hard.gpus"),
        ({"models": {"NVIDIA A100": {"cores": -5}}}, "spec.models.NVIDIA A100.cores"),
        ({"pools": ["Not_A_Pool"]}, "spec.pools"),
        ({"pools": ["a", "a"]}, "spec.pools[1]"),
    ],
)
def test_gpuquota_schema_rejects_invalid_spec(
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    namespace: str,
    spec: dict[str, Any],
    field: str,
) -> None:
    with pytest.raises(ApiException) as rejected:
        _custom(kube_client).create_namespaced_custom_object(
            FRACGPU_GROUP, FRACGPU_VERSION, namespace, "gpuquotas", _gpuquota("bad", spec)
        )
    assert rejected.value.status == 422
    assert field in str(rejected.value.body)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"splitCount": 0}, "spec.splitCount"),
        ({"memoryScaling": 0}, "spec.memoryScaling"),
        ({"memoryScaling": 0.5}, "spec.memoryScaling"),
        ({"memoryScaling": 17}, "spec.memoryScaling"),
        ({"disableCoreLimit": "yes"}, "spec.disableCoreLimit"),
        ({"pool": "UPPER"}, "spec.pool"),
    ],
)
def test_gpunode_schema_rejects_invalid_spec(
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    spec: dict[str, Any],
    field: str,
) -> None:
    with pytest.raises(ApiException) as rejected:
        _custom(kube_client).create_cluster_custom_object(
            FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", _gpunode("bad-node", **spec)
        )
    assert rejected.value.status == 422
    assert field in str(rejected.value.body)


_DEVICE = {"uuid": "GPU-1", "index": 0, "model": "M", "memoryMiB": 1024, "healthy": True}
_RESERVATION: dict[str, Any] = {
    "id": "r1",
    "namespace": "ns",
    "expiresAt": "2030-01-01T00:00:00Z",
    "allocations": [{"uuid": "GPU-1", "cores": 50, "memoryMiB": 512}],
}


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"devices": [{**_DEVICE, "memoryMiB": -1}]}, "status.devices.memoryMiB"),
        ({"devices": [{k: v for k, v in _DEVICE.items() if k != "uuid"}]}, "uuid"),
        ({"devices": [{**_DEVICE, "index": -1}]}, "status.devices.index"),
        (
            {
                "reservations": [
                    {
                        **_RESERVATION,
                        "allocations": [{**_RESERVATION["allocations"][0], "cores": 101}],
                    }
                ]
            },
            "cores",
        ),
        ({"reservations": [{**_RESERVATION, "allocations": []}]}, "allocations"),
        ({"reservations": [{**_RESERVATION, "expiresAt": "tomorrow"}]}, "expiresAt"),
        ({"allocated": [{"uuid": "GPU-1", "cores": -1, "memoryMiB": 0}]}, "status.allocated.cores"),
    ],
)
def test_gpunode_status_schema_rejects_invalid_status(
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    status: dict[str, Any],
    field: str,
) -> None:
    name = f"status-{uuid.uuid4().hex[:6]}"
    custom = _custom(kube_client)
    custom.create_cluster_custom_object(FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", _gpunode(name))
    try:
        with pytest.raises(ApiException) as rejected:
            custom.patch_cluster_custom_object_status(
                FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", name, {"status": status}
            )
        assert rejected.value.status == 422
        assert field in str(rejected.value.body)
    finally:
        custom.delete_cluster_custom_object(FRACGPU_GROUP, FRACGPU_VERSION, "gpunodes", name)


def test_status_is_a_subresource(
    kube_client: kubernetes.client.ApiClient, fracgpu_crds: list[str], namespace: str
) -> None:
    custom = _custom(kube_client)
    quota = {**_gpuquota("q", {"hard": {"cores": 200}}), "status": {"used": {"cores": 7}}}
    created = as_dict(
        custom.create_namespaced_custom_object(
            FRACGPU_GROUP, FRACGPU_VERSION, namespace, "gpuquotas", quota
        )
    )
    assert "status" not in created  # status is dropped on create...
    patched = as_dict(
        custom.patch_namespaced_custom_object_status(
            FRACGPU_GROUP,
            FRACGPU_VERSION,
            namespace,
            "gpuquotas",
            "q",
            {"spec": {"hard": {"cores": 999}}, "status": {"used": {"cores": 50}, "stray": 1}},
        )
    )
    assert patched["status"]["used"]["cores"] == 50
    assert patched["spec"]["hard"]["cores"] == 200  # ...and /status never changes spec
    assert "stray" not in patched["status"]  # unknown fields are pruned, not stored
    updated = as_dict(
        custom.patch_namespaced_custom_object(
            FRACGPU_GROUP,
            FRACGPU_VERSION,
            namespace,
            "gpuquotas",
            "q",
            {"spec": {"hard": {"cores": 300}}, "status": {"used": {"cores": 0}}},
        )
    )
    assert updated["spec"]["hard"]["cores"] == 300
    assert updated["status"]["used"]["cores"] == 50  # the main resource ignores status


def test_printer_columns_show_used_and_hard(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    nodes: NodeFactory,
    namespace: str,
) -> None:
    nodes.gpu_node("printer-node", gpus=2, model="Tesla T4", memory_mib=15360)
    custom = _custom(kube_client)
    custom.patch_cluster_custom_object_status(
        FRACGPU_GROUP,
        FRACGPU_VERSION,
        "gpunodes",
        "printer-node",
        {
            "status": {
                "summary": {
                    "gpus": 2,
                    "model": "Tesla T4",
                    "compute": "150/200",
                    "memoryMiB": "4096/30720",
                }
            }
        },
    )
    row = _cells(_table(control_plane, "/apis/fracgpu.io/v1alpha1/gpunodes"), "printer-node")
    assert (row["GPUs"], row["Model"], row["Compute"], row["Memory(MiB)"]) == (
        2,
        "Tesla T4",
        "150/200",
        "4096/30720",
    )

    custom.create_namespaced_custom_object(
        FRACGPU_GROUP,
        FRACGPU_VERSION,
        namespace,
        "gpuquotas",
        _gpuquota("team", {"hard": {"cores": 400, "memoryMiB": 8192, "gpus": 4}}),
    )
    custom.patch_namespaced_custom_object_status(
        FRACGPU_GROUP,
        FRACGPU_VERSION,
        namespace,
        "gpuquotas",
        "team",
        {"status": {"used": {"cores": 150, "memoryMiB": 1024, "gpus": 2}}},
    )
    row = _cells(
        _table(control_plane, f"/apis/fracgpu.io/v1alpha1/namespaces/{namespace}/gpuquotas"),
        "team",
    )
    used_hard = ("Used-Cores", "Hard-Cores", "Used-MiB", "Hard-MiB", "Used-GPUs", "Hard-GPUs")
    assert tuple(row[c] for c in used_hard) == (150, 400, 1024, 8192, 2, 4)


# --- faults ---------------------------------------------------------------------------


def test_apiserver_restart_keeps_data(
    control_plane: ControlPlane, kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    name = _config_map(kube_client, namespace, "before restart")
    old_pid = control_plane.apiserver.process.pid
    control_plane.restart_apiserver()
    assert control_plane.apiserver.process.pid != old_pid
    # The same client object keeps working: same port, same CA.
    assert _read_config_map(kube_client, namespace, name) == "before restart"
    assert (
        _read_config_map(kube_client, namespace, _config_map(kube_client, namespace, "after"))
        == "after"
    )


def test_apiserver_kill_then_start_keeps_data(
    control_plane: ControlPlane, kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    name = _config_map(kube_client, namespace, "before crash")
    control_plane.kill_apiserver()
    with pytest.raises(Exception):  # noqa: B017 - any connection error while it is down
        _read_config_map(kube_client, namespace, name)
    control_plane.start_apiserver()
    assert _read_config_map(kube_client, namespace, name) == "before crash"


def test_etcd_restart_keeps_data(
    control_plane: ControlPlane, kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    name = _config_map(kube_client, namespace, "before etcd restart")
    old_pid = control_plane.etcd.process.pid
    control_plane.restart_etcd()
    assert control_plane.etcd.process.pid != old_pid
    assert _read_config_map(kube_client, namespace, name) == "before etcd restart"
    assert _read_config_map(kube_client, namespace, _config_map(kube_client, namespace, "x")) == "x"


# --- cleanup --------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_close_leaves_no_process_or_file(e2e_config: E2EConfig) -> None:
    plane = ControlPlane(require_binaries(e2e_config), e2e_config)
    with plane:
        pids = plane.pids()
        assert len(pids) == 2
        assert all(_alive(pid) for pid in pids)
        client = plane.api_client()
        assert kubernetes.client.VersionApi(client).get_code().git_version == "v1.20.2"
    assert not any(_alive(pid) for pid in pids)
    assert e2e_config.keep_logs or not plane.work_dir.exists()


# --- the core codec and the schemas agree -----------------------------------------------


def test_gpuquota_codec_round_trips_through_the_api(
    kube_client: kubernetes.client.ApiClient, fracgpu_crds: list[str], namespace: str
) -> None:
    quota = Quota(
        namespace=namespace,
        name="round-trip",
        hard=ResourceLimits(cores=400, memory_mib=8192, gpus=4),
        hard_by_model={"NVIDIA A100-SXM4-40GB": ResourceLimits(cores=200)},
        pools=("train", "infer"),
        used=ResourceAmounts(cores=150, memory_mib=1024, gpus=2),
        used_by_model={"NVIDIA A100-SXM4-40GB": ResourceAmounts(150, 1024, 2)},
    )
    custom = _custom(kube_client)
    custom.create_namespaced_custom_object(
        FRACGPU_GROUP,
        FRACGPU_VERSION,
        namespace,
        "gpuquotas",
        _gpuquota(quota.name, codec.encode_quota_spec(quota)),
    )
    stored = as_dict(
        custom.patch_namespaced_custom_object_status(
            FRACGPU_GROUP,
            FRACGPU_VERSION,
            namespace,
            "gpuquotas",
            quota.name,
            {"status": codec.encode_quota_status(quota)},
        )
    )
    decoded = codec.decode_quota(stored)
    assert decoded == replace(quota, resource_version=decoded.resource_version)
    assert decoded.resource_version


def test_gpunode_codec_round_trips_through_the_api(
    kube_client: kubernetes.client.ApiClient, nodes: NodeFactory
) -> None:
    info = nodes.gpu_node("codec-node", gpus=2)
    devices = codec.decode_devices("devices", info.devices)
    reservation = Reservation(
        id="r-1",
        node="codec-node",
        namespace="team-a",
        pod="",
        allocations=(
            GPUAllocation(devices[0].uuid, 30, 2048),
            GPUAllocation(devices[1].uuid, 0, 256),
        ),
        expires_at=2_000_000_000,
    )
    custom = _custom(kube_client)
    stored = as_dict(
        custom.patch_cluster_custom_object_status(
            FRACGPU_GROUP,
            FRACGPU_VERSION,
            "gpunodes",
            "codec-node",
            {
                "status": {
                    "devices": [codec.encode_device(d) for d in devices],
                    "reservations": [codec.encode_reservation(reservation)],
                }
            },
        )
    )
    status = stored["status"]
    assert codec.decode_devices("devices", status["devices"]) == devices
    (raw,) = status["reservations"]
    assert codec.decode_reservation("reservation", raw, "codec-node") == reservation
