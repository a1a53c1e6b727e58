"""The certs store tests run against the real etcd + kube-apiserver of tests/e2e.

They use the suite-wide end-to-end fixtures (tests/e2e/fixtures.py: control_plane,
kube_client, kubeconfig, namespace) and are marked `e2e`, so `-m "not e2e"` leaves them
out like the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from certs.settings import Settings

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


def core_api(client: kubernetes.client.ApiClient) -> Any:
    """CoreV1Api, typed as Any: the tests pass raw JSON dicts, which the client sends as-is
    although it annotates model classes."""
    return kubernetes.client.CoreV1Api(client)


def admission_api(client: kubernetes.client.ApiClient) -> Any:
    """AdmissionregistrationV1Api, typed as Any (see core_api)."""
    return kubernetes.client.AdmissionregistrationV1Api(client)


def webhook_entry(name: str, client_config: dict[str, Any]) -> dict[str, Any]:
    """One webhook that matches nothing in other tests' namespaces (label selector)."""
    return {
        "name": name,
        "clientConfig": client_config,
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["configmaps"],
                "scope": "Namespaced",
            }
        ],
        "namespaceSelector": {"matchLabels": {"certs-e2e": name}},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 5,
    }


@dataclass(frozen=True)
class WebhookConfigurations:
    mutating: str
    validating: str

    def settings(self, namespace: str, **overrides: Any) -> Settings:
        return Settings(
            namespace=namespace,
            mutating_webhook=self.mutating,
            validating_webhook=self.validating,
            **overrides,
        )


@pytest.fixture
def webhook_configurations(
    kube_client: kubernetes.client.ApiClient, namespace: str
) -> Iterator[WebhookConfigurations]:
    """A Mutating and a Validating configuration, two webhook entries each, no caBundle."""
    api = admission_api(kube_client)
    suffix = uuid.uuid4().hex[:6]
    service = {"namespace": namespace, "name": "fracgpu-webhook", "port": 443}
    names = WebhookConfigurations(f"certs-m-{suffix}", f"certs-v-{suffix}")
    api.create_mutating_webhook_configuration(
        {
            "metadata": {"name": names.mutating},
            "webhooks": [
                {
                    **webhook_entry(f"{i}.m{suffix}.fracgpu.io", {"service": service}),
                    "reinvocationPolicy": "Never",
                }
                for i in ("pods", "other")
            ],
        }
    )
    api.create_validating_webhook_configuration(
        {
            "metadata": {"name": names.validating},
            "webhooks": [
                webhook_entry(f"{i}.v{suffix}.fracgpu.io", {"service": service})
                for i in ("pods", "other")
            ],
        }
    )
    yield names
    for delete, name in (
        (api.delete_mutating_webhook_configuration, names.mutating),
        (api.delete_validating_webhook_configuration, names.validating),
    ):
        try:
            delete(name)
        except ApiException as error:
            if error.status != 404:
                raise
