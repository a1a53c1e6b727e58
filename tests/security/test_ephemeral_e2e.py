"""Debug (ephemeral) containers on a real kube-apiserver with the EphemeralContainers
feature on: a container added to a running pod through ``pods/ephemeralcontainers`` gets
``NVIDIA_VISIBLE_DEVICES=void`` from the mutating webhook, and one that sets a reserved
variable itself is refused. The webhook runs as fracgpu's service account with the chart's
RBAC and webhook configurations; the debugging user is the cluster admin, who is not one of
fracgpu's trusted accounts (kube-apiserver 1.20 sends an ``EphemeralContainers`` object)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from fracgpu import names
from tests.e2e.webhook_harness import Webhooks

pytestmark = pytest.mark.e2e


def _ephemeral_path(namespace: str, pod: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{pod}/ephemeralcontainers"


def _call(
    client: kubernetes.client.ApiClient, method: str, path: str, body: Any = None
) -> dict[str, Any]:
    """A raw call: the typed client has no method for 1.20's EphemeralContainers object."""
    config = client.configuration
    headers = {
        "Authorization": config.get_api_key_with_prefix("BearerToken"),
        "Accept": "application/json",
        "Content-Type": "application/json",
    }
    response = client.call_api(method, config.host + path, header_params=headers, body=body)
    response.read()
    if not 200 <= response.status < 300:
        raise ApiException(http_resp=response)
    result: dict[str, Any] = json.loads(response.data)
    return result


def _add_debug_container(
    client: kubernetes.client.ApiClient, namespace: str, pod: str, container: dict[str, Any]
) -> None:
    """What ``kubectl debug`` does on 1.20: read the list, append, write it back."""
    path = _ephemeral_path(namespace, pod)
    current = _call(client, "GET", path)
    current["ephemeralContainers"] = [*(current.get("ephemeralContainers") or []), container]
    _call(client, "PUT", path, current)


@pytest.fixture
def running_pod(
    kube_client: kubernetes.client.ApiClient, namespace: str, one_webhook: Webhooks
) -> str:
    name = f"web-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "nginx"}]},
    }
    kubernetes.client.CoreV1Api(kube_client).create_namespaced_pod(namespace, body)
    return name


def test_a_debug_container_gets_no_gpu(
    kube_client: kubernetes.client.ApiClient, namespace: str, running_pod: str
) -> None:
    debug = {"name": "debugger", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04"}
    _add_debug_container(kube_client, namespace, running_pod, debug)
    pod = kubernetes.client.CoreV1Api(kube_client).read_namespaced_pod(running_pod, namespace)
    (added,) = pod.spec.ephemeral_containers
    env = {e.name: e.value for e in added.env or []}
    assert env == {names.ENV_VISIBLE_DEVICES: names.VISIBLE_DEVICES_NONE}


@pytest.mark.parametrize(
    "variable",
    [
        {"name": names.ENV_VISIBLE_DEVICES, "value": "all"},
        {"name": "FRACGPU_LIMITS_FILE", "value": "/tmp/mine"},
    ],
    ids=["all-gpus", "reserved-fracgpu-variable"],
)
def test_a_debug_container_cannot_set_reserved_variables(
    kube_client: kubernetes.client.ApiClient,
    namespace: str,
    running_pod: str,
    variable: dict[str, str],
) -> None:
    debug = {"name": "debugger", "image": "cuda:12", "env": [variable]}
    with pytest.raises(ApiException) as refused:
        _add_debug_container(kube_client, namespace, running_pod, debug)
    assert refused.value.status in (400, 403)
    message = json.loads(refused.value.body)["message"]
    assert f'variable {variable["name"]} in container "debugger"' in message
    assert "only fracgpu may set" in message
    pod = kubernetes.client.CoreV1Api(kube_client).read_namespaced_pod(running_pod, namespace)
    assert not pod.spec.ephemeral_containers
