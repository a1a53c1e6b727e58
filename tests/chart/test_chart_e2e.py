"""The chart's own webhook configurations and RBAC, applied to a real kube-apiserver.

The webhook itself does not run here: its URL points at a closed loopback port, which is
exactly the outage that failurePolicy Fail and the namespace selector are about.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes.client.exceptions import ApiException

from tests.chart import chartfiles
from tests.e2e.harness import ControlPlane, create_namespace
from tests.e2e.harness.identities import WEBHOOK_NAMESPACE

pytestmark = pytest.mark.e2e


def _ca_pem() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chart-test-ca")])
    start = dt.datetime.fromtimestamp(time.time() - 60, dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _body(document: dict[str, Any]) -> Any:
    return dict(document)


def _ignore_missing(delete: Callable[[], object]) -> None:
    try:
        delete()
    except ApiException as error:
        if error.status != 404:
            raise


@contextlib.contextmanager
def _registered(client: kubernetes.client.ApiClient) -> Iterator[tuple[dict, dict]]:  # type: ignore[type-arg]
    """The chart's webhook configurations registered with an unreachable webhook URL."""
    api = kubernetes.client.AdmissionregistrationV1Api(client)
    names = chartfiles.Names(release_namespace="fracgpu-chart-own")
    mutating, validating = chartfiles.webhook_configurations(
        f"https://127.0.0.1:{_closed_port()}", _ca_pem(), names=names, timeout_seconds=2
    )
    api.create_mutating_webhook_configuration(_body(mutating))
    try:
        api.create_validating_webhook_configuration(_body(validating))
        try:
            yield mutating, validating
        finally:
            _ignore_missing(lambda: api.delete_validating_webhook_configuration(names.validating))
    finally:
        _ignore_missing(lambda: api.delete_mutating_webhook_configuration(names.mutating))


@pytest.fixture
def webhooks(kube_client: kubernetes.client.ApiClient) -> Iterator[tuple[dict, dict]]:  # type: ignore[type-arg]
    with _registered(kube_client) as configurations:
        yield configurations


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def _create_pod(client: kubernetes.client.ApiClient, namespace: str, name: str) -> None:
    kubernetes.client.CoreV1Api(client).create_namespaced_pod(namespace, _body(_pod(name)))


def test_api_server_stores_the_definitions_unchanged(
    kube_client: kubernetes.client.ApiClient,
    webhooks: tuple[dict, dict],  # type: ignore[type-arg]
) -> None:
    mutating, validating = webhooks
    api = kubernetes.client.AdmissionregistrationV1Api(kube_client)
    stored_m = kube_client.sanitize_for_serialization(
        api.read_mutating_webhook_configuration(mutating["metadata"]["name"])
    )
    stored_v = kube_client.sanitize_for_serialization(
        api.read_validating_webhook_configuration(validating["metadata"]["name"])
    )
    for sent, stored in ((mutating, stored_m), (validating, stored_v)):
        for hook_sent, hook_stored in zip(sent["webhooks"], stored["webhooks"], strict=True):
            for key, value in hook_sent.items():
                assert hook_stored[key] == value, key


def test_outage_blocks_pods_in_managed_namespaces(
    kube_client: kubernetes.client.ApiClient,
    webhooks: tuple[dict, dict],  # type: ignore[type-arg]
) -> None:
    managed = create_namespace(kube_client, prefix="chart-managed")
    with pytest.raises(ApiException) as caught:
        _create_pod(kube_client, managed, "blocked")
    assert caught.value.status == 500
    assert "mutate.fracgpu.io" in str(caught.value.body)


def test_outage_never_blocks_status_updates_finalizers_or_deletion(
    kube_client: kubernetes.client.ApiClient,
) -> None:
    # A pod that was admitted before the webhook went down (it carries a controller's
    # finalizer), then an outage: what kubelet and controllers do to existing pods goes on.
    managed = create_namespace(kube_client, prefix="chart-existing")
    core = kubernetes.client.CoreV1Api(kube_client)
    pod = _pod("existing")
    pod["metadata"]["finalizers"] = ["example.com/hold"]
    core.create_namespaced_pod(managed, _body(pod))
    with _registered(kube_client):
        with pytest.raises(ApiException) as caught:  # the configurations are in force ...
            _create_pod(kube_client, managed, "new")
        assert caught.value.status == 500
        # ... yet kubelet's status report (pods/status) ...
        condition = {"type": "Ready", "status": "False", "reason": "Outage"}
        core.patch_namespaced_pod_status(
            "existing", managed, _body({"status": {"conditions": [condition]}})
        )
        # ... a controller relabelling the pod (an UPDATE of the pod itself) ...
        core.patch_namespaced_pod(
            "existing", managed, _body({"metadata": {"labels": {"released": "true"}}})
        )
        # ... deletion, and the finalizer's removal that completes it all go through.
        core.delete_namespaced_pod("existing", managed)
        terminating = core.read_namespaced_pod("existing", managed)
        assert terminating.metadata.deletion_timestamp is not None
        assert terminating.metadata.labels == {"released": "true"}
        assert terminating.status.conditions[0].reason == "Outage"
        core.patch_namespaced_pod("existing", managed, _body({"metadata": {"finalizers": None}}))
        with pytest.raises(ApiException) as gone:
            core.read_namespaced_pod("existing", managed)
        assert gone.value.status == 404


def test_opted_out_namespace_is_never_sent_to_the_webhook(
    kube_client: kubernetes.client.ApiClient,
    webhooks: tuple[dict, dict],  # type: ignore[type-arg]
) -> None:
    ignored = create_namespace(
        kube_client, prefix="chart-ignored", labels={"fracgpu.io/ignore": "true"}
    )
    _create_pod(kube_client, ignored, "allowed")


def test_system_and_own_namespaces_are_exempt_by_name(
    kube_client: kubernetes.client.ApiClient,
    webhooks: tuple[dict, dict],  # type: ignore[type-arg]
) -> None:
    # Kubernetes 1.21+ labels every namespace with its name; 1.20 (this API server) does
    # not, so set the label as a newer API server would.
    core = kubernetes.client.CoreV1Api(kube_client)
    for name in ("fracgpu-chart-own", "kube-node-lease"):
        labels = {"kubernetes.io/metadata.name": name}
        try:
            core.create_namespace(_body({"metadata": {"name": name, "labels": labels}}))
        except ApiException as error:
            if error.status != 409:
                raise
            core.patch_namespace(name, _body({"metadata": {"labels": labels}}))
        _create_pod(kube_client, name, f"exempt-{int(time.time() * 1000)}")


def test_dry_run_is_sent_too(
    kube_client: kubernetes.client.ApiClient,
    webhooks: tuple[dict, dict],  # type: ignore[type-arg]
) -> None:
    # sideEffects NoneOnDryRun: the API server calls the webhook for dry-run requests as
    # well (an unreachable one fails them), rather than skipping admission.
    managed = create_namespace(kube_client, prefix="chart-dry")
    core = kubernetes.client.CoreV1Api(kube_client)
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(managed, _body(_pod("dry")), dry_run="All")
    assert "fracgpu.io" in str(caught.value.body)


def _ensure_namespace(client: kubernetes.client.ApiClient, name: str) -> None:
    try:
        kubernetes.client.CoreV1Api(client).create_namespace(_body({"metadata": {"name": name}}))
    except ApiException as error:
        if error.status != 409:
            raise


def _apply_rbac(client: kubernetes.client.ApiClient, component: str) -> Callable[[], None]:
    rbac = kubernetes.client.RbacAuthorizationV1Api(client)
    created: list[Callable[[], object]] = []
    for obj in chartfiles.rbac_objects(component, WEBHOOK_NAMESPACE):
        kind, name = obj["kind"], obj["metadata"]["name"]
        namespace = obj["metadata"].get("namespace")
        create = {
            "ClusterRole": lambda o: rbac.create_cluster_role(_body(o)),
            "ClusterRoleBinding": lambda o: rbac.create_cluster_role_binding(_body(o)),
            "Role": lambda o, ns=namespace: rbac.create_namespaced_role(ns, _body(o)),
            "RoleBinding": lambda o, ns=namespace: rbac.create_namespaced_role_binding(
                ns, _body(o)
            ),
        }[kind]
        delete = {
            "ClusterRole": lambda n=name: rbac.delete_cluster_role(n),
            "ClusterRoleBinding": lambda n=name: rbac.delete_cluster_role_binding(n),
            "Role": lambda n=name, ns=namespace: rbac.delete_namespaced_role(n, ns),
            "RoleBinding": lambda n=name, ns=namespace: rbac.delete_namespaced_role_binding(n, ns),
        }[kind]
        _ignore_missing(delete)
        create(obj)
        created.append(delete)

    def cleanup() -> None:
        for delete in reversed(created):
            _ignore_missing(delete)

    return cleanup


def _allowed(
    client: kubernetes.client.ApiClient,
    user: str,
    verb: str,
    resource: str,
    *,
    group: str = "",
    namespace: str = "",
    subresource: str = "",
    name: str = "",
) -> bool:
    review = {
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{WEBHOOK_NAMESPACE}"],
            "resourceAttributes": {
                "group": group,
                "resource": resource,
                "verb": verb,
                "namespace": namespace,
                "subresource": subresource,
                "name": name,
            },
        }
    }
    api = kubernetes.client.AuthorizationV1Api(client)
    result = api.create_subject_access_review(_body(review))
    return bool(result.status and result.status.allowed)


def _wait_allowed(check: Callable[[], bool]) -> None:
    # The RBAC authorizer sees new bindings through an informer: a moment's delay.
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "the chart's binding never took effect"
        time.sleep(0.05)


@contextlib.contextmanager
def _rbac_applied(client: kubernetes.client.ApiClient, component: str) -> Iterator[None]:
    _ensure_namespace(client, WEBHOOK_NAMESPACE)
    cleanup = _apply_rbac(client, component)
    try:
        yield
    finally:
        cleanup()


def test_webhook_rbac_on_a_real_api_server(
    control_plane: ControlPlane, kube_client: kubernetes.client.ApiClient
) -> None:
    user = control_plane.identity("webhook").user
    with _rbac_applied(kube_client, "webhook"):
        _wait_allowed(lambda: _allowed(kube_client, user, "watch", "pods"))
        webhook = control_plane.api_client("webhook")
        # What it needs works with its own token ...
        kubernetes.client.CoreV1Api(webhook).list_pod_for_all_namespaces(limit=1)
        assert _allowed(
            kube_client, user, "patch", "gpunodes", group="fracgpu.io", subresource="status"
        )
        assert _allowed(
            kube_client,
            user,
            "update",
            "leases",
            group="coordination.k8s.io",
            namespace=WEBHOOK_NAMESPACE,
            name="fracgpu-webhook",
        )
        # ... and nothing more.
        with pytest.raises(ApiException) as caught:
            kubernetes.client.CoreV1Api(webhook).list_secret_for_all_namespaces(limit=1)
        assert caught.value.status == 403
        assert not _allowed(kube_client, user, "update", "gpunodes", group="fracgpu.io")
        assert not _allowed(kube_client, user, "create", "pods", namespace="default")
        assert not _allowed(
            kube_client,
            user,
            "update",
            "leases",
            group="coordination.k8s.io",
            namespace=WEBHOOK_NAMESPACE,
            name="someone-elses-lease",
        )


def test_agent_rbac_on_a_real_api_server(
    control_plane: ControlPlane, kube_client: kubernetes.client.ApiClient
) -> None:
    user = control_plane.identity("agent").user
    with _rbac_applied(kube_client, "agent"):
        _wait_allowed(lambda: _allowed(kube_client, user, "get", "pods", namespace="default"))
        agent = control_plane.api_client("agent")
        with pytest.raises(ApiException) as missing:
            kubernetes.client.CoreV1Api(agent).read_namespaced_pod("nope", "default")
        assert missing.value.status == 404  # allowed to look; the pod just does not exist
        assert _allowed(
            kube_client, user, "patch", "gpunodes", group="fracgpu.io", subresource="status"
        )
        # Queue mode: the agent lists its node's pods (by field selector; RBAC cannot narrow
        # a list to one node) to tell which queued pod kubelet admits. It writes none.
        kubernetes.client.CoreV1Api(agent).list_pod_for_all_namespaces(limit=1)
        assert not _allowed(kube_client, user, "patch", "pods", namespace="default")
        assert not _allowed(kube_client, user, "delete", "pods", namespace="default")
        assert not _allowed(
            kube_client, user, "patch", "gpuquotas", group="fracgpu.io", subresource="status"
        )
