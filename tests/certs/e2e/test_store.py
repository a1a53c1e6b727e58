"""The Secrets and caBundles on a real kube-apiserver: create, idempotence, renewal, CA
rotation with overlap, conflicts (real 409s from a concurrent writer), and errors."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes.client
import pytest

from certs import authority
from certs.errors import StoreError
from certs.reconcile import ensure
from certs.settings import Settings
from certs.store import KubeStore, Snapshot, connect
from tests.e2e.harness import ControlPlane

from .conftest import WebhookConfigurations, admission_api, core_api

pytestmark = pytest.mark.e2e

Json = dict[str, Any]


class Clock:
    """Real time plus an offset the test moves forward."""

    def __init__(self) -> None:
        self.start = datetime.now(UTC)
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return self.start + self.offset


@dataclass
class Cluster:
    client: kubernetes.client.ApiClient
    settings: Settings

    def store(self) -> KubeStore:
        return KubeStore(self.client, self.settings)

    def secret(self, name: str) -> Json:
        response = core_api(self.client).read_namespaced_secret(
            name, self.settings.namespace, _preload_content=False
        )
        result: Json = json.loads(response.data)
        return result

    def webhooks(self) -> list[Json]:
        api = admission_api(self.client)
        out = []
        for read, name in (
            (api.read_mutating_webhook_configuration, self.settings.mutating_webhook),
            (api.read_validating_webhook_configuration, self.settings.validating_webhook),
        ):
            response = read(name, _preload_content=False)
            out.append(json.loads(response.data))
        return out

    def resource_versions(self) -> dict[str, str]:
        objects = {
            "ca": self.secret(self.settings.ca_secret),
            "serving": self.secret(self.settings.secret),
        }
        objects.update(zip(("mutating", "validating"), self.webhooks(), strict=True))
        return {key: obj["metadata"]["resourceVersion"] for key, obj in objects.items()}

    def ca_bundles(self) -> list[bytes]:
        return [
            base64.b64decode(entry["clientConfig"]["caBundle"])
            for configuration in self.webhooks()
            for entry in configuration["webhooks"]
        ]


def _data(secret: Json, key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


@pytest.fixture
def cluster(
    kube_client: kubernetes.client.ApiClient,
    namespace: str,
    webhook_configurations: WebhookConfigurations,
) -> Cluster:
    return Cluster(kube_client, webhook_configurations.settings(namespace))


def test_first_run_creates_both_secrets_and_patches_every_webhook(cluster: Cluster) -> None:
    outcome = ensure(cluster.store(), cluster.settings, Clock())
    s = cluster.settings
    assert [str(w) for w in outcome.writes] == [
        f"created Secret {s.namespace}/{s.ca_secret}",
        f"updated MutatingWebhookConfiguration {s.mutating_webhook}",
        f"updated ValidatingWebhookConfiguration {s.validating_webhook}",
        f"created Secret {s.namespace}/{s.secret}",
    ]
    serving = cluster.secret(s.secret)
    ca_secret = cluster.secret(s.ca_secret)
    assert serving["type"] == ca_secret["type"] == "kubernetes.io/tls"
    assert set(serving["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert set(ca_secret["data"]) == {"tls.crt", "tls.key"}
    assert serving["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "fracgpu-certs"
    ca = authority.decode_pair(_data(ca_secret, "tls.crt"), _data(ca_secret, "tls.key"))
    pair = authority.decode_pair(_data(serving, "tls.crt"), _data(serving, "tls.key"))
    # The CA key is not in the Secret the webhook mounts.
    assert ca.key_pem() not in serving["data"].values()
    assert _data(serving, "tls.key") != _data(ca_secret, "tls.key")
    assert authority.is_signed_by(pair.cert, ca.cert)
    assert authority.dns_names(pair.cert) == set(s.dns_names)
    assert _data(serving, "ca.crt") == ca.cert_pem()
    bundles = cluster.ca_bundles()
    assert len(bundles) == 4
    assert set(bundles) == {ca.cert_pem()}


def test_second_run_writes_nothing(cluster: Cluster) -> None:
    clock = Clock()
    ensure(cluster.store(), cluster.settings, clock)
    before = cluster.resource_versions()
    clock.offset = timedelta(days=30)
    again = ensure(cluster.store(), cluster.settings, clock)
    assert again.writes == ()
    assert again.decision.nothing_to_do
    assert cluster.resource_versions() == before


def test_a_cleared_ca_bundle_is_patched_back_and_nothing_else_is_touched(
    cluster: Cluster,
) -> None:
    """`helm upgrade` re-applies the configurations with an empty caBundle."""
    clock = Clock()
    ensure(cluster.store(), cluster.settings, clock)
    api = admission_api(cluster.client)
    validating = cluster.webhooks()[1]
    for entry in validating["webhooks"]:
        entry["clientConfig"].pop("caBundle")
    api.replace_validating_webhook_configuration(cluster.settings.validating_webhook, validating)
    before = cluster.resource_versions()

    outcome = ensure(cluster.store(), cluster.settings, clock)

    assert [str(w) for w in outcome.writes] == [
        f"updated ValidatingWebhookConfiguration {cluster.settings.validating_webhook}"
    ]
    after = cluster.resource_versions()
    assert after["validating"] != before["validating"]
    assert {k: v for k, v in after.items() if k != "validating"} == {
        k: v for k, v in before.items() if k != "validating"
    }
    assert len(set(cluster.ca_bundles())) == 1


def test_serving_renewal_rewrites_only_the_serving_secret(cluster: Cluster) -> None:
    clock = Clock()
    ensure(cluster.store(), cluster.settings, clock)
    before = cluster.resource_versions()
    old_cert = _data(cluster.secret(cluster.settings.secret), "tls.crt")

    clock.offset = 0.71 * cluster.settings.serving_validity
    outcome = ensure(cluster.store(), cluster.settings, clock)

    assert outcome.decision.summary().startswith("renew-serving: the serving certificate expires")
    assert [w.kind for w in outcome.writes] == ["Secret"]
    after = cluster.resource_versions()
    assert after["serving"] != before["serving"]
    assert (after["ca"], after["mutating"], after["validating"]) == (
        before["ca"],
        before["mutating"],
        before["validating"],
    )
    new_cert = authority.decode_certs(_data(cluster.secret(cluster.settings.secret), "tls.crt"))
    assert new_cert[0] != authority.decode_certs(old_cert)[0]
    assert new_cert[0].not_valid_after_utc == (clock() + cluster.settings.serving_validity).replace(
        microsecond=0
    )


def test_ca_rotation_keeps_both_cas_in_every_bundle_until_the_overlap_ends(
    cluster: Cluster,
) -> None:
    clock = Clock()
    s = cluster.settings
    ensure(cluster.store(), s, clock)
    old_ca = _data(cluster.secret(s.ca_secret), "tls.crt")

    clock.offset = 0.71 * s.ca_validity
    rotation = ensure(cluster.store(), s, clock)
    # CA first, then the caBundles, then the serving Secret: by the time a webhook Pod
    # serves the new certificate, the apiserver already trusts the new CA.
    assert [w.kind for w in rotation.writes] == [
        "Secret",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "Secret",
    ]
    new_ca = _data(cluster.secret(s.ca_secret), "tls.crt")
    assert new_ca != old_ca
    overlap = new_ca + old_ca
    assert set(cluster.ca_bundles()) == {overlap}
    serving = cluster.secret(s.secret)
    assert _data(serving, "ca.crt") == overlap
    pair = authority.decode_certs(_data(serving, "tls.crt"))[0]
    assert authority.is_signed_by(pair, authority.decode_certs(new_ca)[0])
    assert rotation.next_due == (clock() + s.ca_overlap).replace(microsecond=0)

    clock.offset += s.ca_overlap - timedelta(minutes=1)
    during = ensure(cluster.store(), s, clock)
    assert during.writes == ()

    clock.offset += timedelta(minutes=1)
    done = ensure(cluster.store(), s, clock)
    assert done.decision.summary() == (
        "update-bundle: drop 1 replaced or expired CA(s) from the caBundle"
    )
    assert set(cluster.ca_bundles()) == {new_ca}
    assert _data(cluster.secret(s.secret), "ca.crt") == new_ca
    assert _data(cluster.secret(s.secret), "tls.crt") == _data(serving, "tls.crt")


class RacingStore(KubeStore):
    """A real store that lets another writer act between its first read and its write."""

    def __init__(self, client: kubernetes.client.ApiClient, settings: Settings, race: Any):
        super().__init__(client, settings)
        self._race = race
        self.reads = 0

    def read(self) -> Snapshot:
        snapshot = super().read()
        self.reads += 1
        if self.reads == 1:
            self._race()
        return snapshot


def test_conflict_on_the_serving_secret_rereads_and_keeps_the_other_writers_change(
    cluster: Cluster,
) -> None:
    clock = Clock()
    s = cluster.settings
    ensure(cluster.store(), s, clock)
    core = core_api(cluster.client)

    def annotate() -> None:
        core.patch_namespaced_secret(
            s.secret, s.namespace, {"metadata": {"annotations": {"team": "gpu"}}}
        )

    clock.offset = 0.71 * s.serving_validity
    store = RacingStore(cluster.client, s, annotate)
    outcome = ensure(store, s, clock)

    assert outcome.attempts == 2 and store.reads == 2
    assert [w.kind for w in outcome.writes] == ["Secret"]
    serving = cluster.secret(s.secret)
    assert serving["metadata"]["annotations"]["team"] == "gpu"
    cert = authority.decode_certs(_data(serving, "tls.crt"))[0]
    assert cert.not_valid_after_utc == (clock() + s.serving_validity).replace(microsecond=0)


def test_two_first_runs_racing_converge_on_one_ca(cluster: Cluster) -> None:
    clock = Clock()
    s = cluster.settings
    other: list[object] = []

    def other_job_runs_first() -> None:
        other.append(ensure(cluster.store(), s, clock))

    store = RacingStore(cluster.client, s, other_job_runs_first)
    outcome = ensure(store, s, clock)

    # Our create of the CA Secret met AlreadyExists (409); re-reading found all done.
    assert outcome.attempts == 2
    assert outcome.writes == ()
    assert outcome.decision.nothing_to_do
    ca = _data(cluster.secret(s.ca_secret), "tls.crt")
    assert set(cluster.ca_bundles()) == {ca}


def test_conflict_on_a_webhook_configuration_is_retried_to_a_consistent_state(
    cluster: Cluster,
) -> None:
    clock = Clock()
    s = cluster.settings
    api = admission_api(cluster.client)

    def label_it() -> None:
        api.patch_mutating_webhook_configuration(
            s.mutating_webhook, {"metadata": {"labels": {"owner": "platform"}}}
        )

    outcome = ensure(RacingStore(cluster.client, s, label_it), s, clock)

    assert outcome.attempts == 2
    ca_secret = cluster.secret(s.ca_secret)
    ca = authority.decode_pair(_data(ca_secret, "tls.crt"), _data(ca_secret, "tls.key"))
    serving = cluster.secret(s.secret)
    assert authority.is_signed_by(authority.decode_certs(_data(serving, "tls.crt"))[0], ca.cert)
    assert set(cluster.ca_bundles()) == {ca.cert_pem()}
    assert cluster.webhooks()[0]["metadata"]["labels"]["owner"] == "platform"
    assert ensure(cluster.store(), s, clock).writes == ()


def test_unreadable_secrets_are_replaced_with_the_reason_given(cluster: Cluster) -> None:
    s = cluster.settings
    core = core_api(cluster.client)
    core.create_namespaced_secret(
        s.namespace,
        {
            "metadata": {"name": s.ca_secret},
            "type": "kubernetes.io/tls",
            "data": {
                "tls.crt": base64.b64encode(b"not a certificate").decode(),
                "tls.key": base64.b64encode(b"not a key").decode(),
            },
        },
    )
    outcome = ensure(cluster.store(), s, Clock())
    assert any("no PEM 'CERTIFICATE' block" in r for r in outcome.decision.reasons)
    ca_secret = cluster.secret(s.ca_secret)
    ca = authority.decode_pair(_data(ca_secret, "tls.crt"), _data(ca_secret, "tls.key"))
    assert set(cluster.ca_bundles()) == {ca.cert_pem()}


def test_a_missing_webhook_configuration_is_a_clear_error(
    kube_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    s = Settings(namespace=namespace, mutating_webhook="absent-m", validating_webhook="")
    with pytest.raises(StoreError, match="MutatingWebhookConfiguration absent-m not found") as info:
        ensure(KubeStore(kube_client, s), s, Clock())
    assert "post-install" in str(info.value)
    # The Secrets were still written, so the webhook Pods can start meanwhile.
    assert "created Secret" in str(info.value)


def test_missing_permissions_name_what_is_needed(
    control_plane: ControlPlane, cluster: Cluster
) -> None:
    stranger = control_plane.api_client("tenant2")
    with pytest.raises(StoreError, match="HTTP 403") as info:
        ensure(KubeStore(stranger, cluster.settings), cluster.settings, Clock())
    assert "needs get/create/update on secrets" in str(info.value)


def test_connect_reads_a_kubeconfig(cluster: Cluster, kubeconfig: Any) -> None:
    s = Settings(
        namespace=cluster.settings.namespace,
        mutating_webhook=cluster.settings.mutating_webhook,
        validating_webhook=cluster.settings.validating_webhook,
        kubeconfig=kubeconfig,
    )
    outcome = ensure(KubeStore(connect(s), s), s, Clock())
    assert len(outcome.writes) == 4
