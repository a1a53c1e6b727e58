"""The Kubernetes side: the two Secrets and the caBundle of the webhook configurations.

Layout (see docs/certificates.md):
- serving Secret (type kubernetes.io/tls, mounted by the webhook): `tls.crt`, `tls.key`, and
  `ca.crt` = the trust bundle (current CA first, then replaced CAs still in their overlap);
- CA Secret (type kubernetes.io/tls, mounted by nothing): `tls.crt`/`tls.key` = the CA. The
  CA key is kept apart so a compromised webhook Pod cannot mint certificates, and so the
  webhook's RBAC never needs to read it.

Objects are read and written as raw JSON (not the client's models) so that fields this client
version does not know survive an update. Every update carries the resourceVersion that was
read; a 409 (or a 404 for an object deleted since) raises StoreConflictError and the caller
re-reads and re-decides. Writes happen only where the stored bytes differ from the desired
ones, in the order that keeps every client working: CA Secret, webhook caBundles, then the
serving Secret (so the apiserver trusts a new CA before any webhook Pod serves its cert).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3
import yaml
from cryptography import x509
from kubernetes.client.exceptions import ApiException

from . import authority
from .errors import CertificateError, StoreConflictError, StoreError
from .policy import StoredState
from .settings import Settings

log = logging.getLogger("fracgpu.certs")

SECRET_TYPE = "kubernetes.io/tls"
CERT_KEY = "tls.crt"
PRIVATE_KEY_KEY = "tls.key"
CA_KEY = "ca.crt"
LABELS = {
    "app.kubernetes.io/managed-by": "fracgpu-certs",
    "app.kubernetes.io/part-of": "fracgpu",
}
_TIMEOUT_S = 30

Json = dict[str, Any]


@dataclass(frozen=True)
class WebhookObject:
    kind: str  # MutatingWebhookConfiguration | ValidatingWebhookConfiguration
    name: str
    body: Json | None  # None: not found


@dataclass(frozen=True)
class Snapshot:
    """The objects as read (with their resourceVersions) and the state decoded from them."""

    ca_secret: Json | None
    serving_secret: Json | None
    webhooks: tuple[WebhookObject, ...]
    state: StoredState


@dataclass(frozen=True)
class Write:
    verb: str  # created | updated
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.verb} {self.kind} {self.name}"


# What to do when no kubeconfig is found (kubectl-fracgpu says the same, but lives in the
# webhook package, which certs may not import).
NO_KUBECONFIG_HINT = (
    "pass --kubeconfig, set KUBECONFIG or create ~/.kube/config, or inside a Pod pass --in-cluster"
)


def _default_kubeconfig(environ: Mapping[str, str]) -> str:
    """The kubeconfig files kubectl would read without --kubeconfig (``:``-separated), or
    raise StoreError, saying what to do, when none of them exists."""
    listed = environ.get("KUBECONFIG") or ""
    files = [p for p in listed.split(os.pathsep) if p] or ["~/.kube/config"]
    if not any(os.path.isfile(os.path.expanduser(p)) for p in files):
        where = f"KUBECONFIG={listed} names no file" if listed else "~/.kube/config does not exist"
        raise StoreError(
            f"cannot load the kubeconfig: no kubeconfig found ({where}): {NO_KUBECONFIG_HINT}"
        )
    return os.pathsep.join(files)


def connect(settings: Settings) -> kubernetes.client.ApiClient:
    """An API client from the in-cluster service account or a kubeconfig."""
    configuration = kubernetes.client.Configuration()
    if not settings.in_cluster and settings.kubeconfig and not settings.kubeconfig.is_file():
        raise StoreError(f"cannot load the kubeconfig: {settings.kubeconfig} does not exist")
    try:
        if settings.in_cluster:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        else:
            # KUBECONFIG as it is now (the client read it once, when it was imported).
            config_file = settings.kubeconfig or _default_kubeconfig(os.environ)
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(config_file), client_configuration=configuration
            )
    except kubernetes.config.ConfigException as error:
        source = "the in-cluster service account" if settings.in_cluster else "the kubeconfig"
        raise StoreError(f"cannot load {source}: {error}") from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise StoreError(
            f"cannot load the kubeconfig: {settings.kubeconfig or '~/.kube/config'}{where}: "
            "not valid YAML"
        ) from None
    return kubernetes.client.ApiClient(configuration)


class KubeStore:
    """Reads and writes the certificate state of one webhook installation."""

    def __init__(self, client: kubernetes.client.ApiClient, settings: Settings) -> None:
        self._settings = settings
        # Typed as Any: we pass and receive raw JSON, while the client annotates model classes.
        self._core: Any = kubernetes.client.CoreV1Api(client)
        self._admission: Any = kubernetes.client.AdmissionregistrationV1Api(client)

    # --- read ---------------------------------------------------------------------------

    def read(self) -> Snapshot:
        settings = self._settings
        ca_secret = self._read_secret(settings.ca_secret)
        serving_secret = self._read_secret(settings.secret)
        webhooks = tuple(
            WebhookObject(kind, name, self._read_webhook(kind, name))
            for kind, name in settings.webhook_configurations
        )
        return Snapshot(
            ca_secret=ca_secret,
            serving_secret=serving_secret,
            webhooks=webhooks,
            state=self._decode(ca_secret, serving_secret, webhooks),
        )

    def _decode(
        self,
        ca_secret: Json | None,
        serving_secret: Json | None,
        webhooks: tuple[WebhookObject, ...],
    ) -> StoredState:
        problems: list[str] = []
        ca = _decode_pair(ca_secret, self._secret_ref(self._settings.ca_secret), problems)
        serving = _decode_pair(serving_secret, self._secret_ref(self._settings.secret), problems)
        bundles: list[bytes] = []
        if serving_secret is not None:
            bundles.append(_secret_value(serving_secret, CA_KEY))
        for webhook in webhooks:
            bundles.extend(_ca_bundles(webhook.body))
        return StoredState(ca=ca, serving=serving, bundle=_union(bundles), problems=tuple(problems))

    def _read_secret(self, name: str) -> Json | None:
        return self._call(
            f"read Secret {self._secret_ref(name)}",
            lambda: self._core.read_namespaced_secret(
                name,
                self._settings.namespace,
                _preload_content=False,
                _request_timeout=_TIMEOUT_S,
            ),
            missing_ok=True,
        )

    def _read_webhook(self, kind: str, name: str) -> Json | None:
        read = (
            self._admission.read_mutating_webhook_configuration
            if kind.startswith("Mutating")
            else self._admission.read_validating_webhook_configuration
        )
        return self._call(
            f"read {kind} {name}",
            lambda: read(name, _preload_content=False, _request_timeout=_TIMEOUT_S),
            missing_ok=True,
        )

    # --- write --------------------------------------------------------------------------

    def write(self, snapshot: Snapshot, desired: StoredState) -> tuple[Write, ...]:
        """Bring the objects to `desired`, writing only what differs; returns the writes."""
        if desired.ca is None or desired.serving is None:
            raise ValueError("desired state needs a CA and a serving certificate")
        settings = self._settings
        bundle_pem = authority.encode_certs(desired.bundle)
        writes: list[Write] = []
        ca_data = {CERT_KEY: desired.ca.cert_pem(), PRIVATE_KEY_KEY: desired.ca.key_pem()}
        written = self._put_secret(settings.ca_secret, snapshot.ca_secret, ca_data)
        if written:
            writes.append(written)
        missing: list[str] = []
        for webhook in snapshot.webhooks:
            if webhook.body is None:
                missing.append(f"{webhook.kind} {webhook.name}")
                continue
            written = self._put_ca_bundle(webhook, bundle_pem)
            if written:
                writes.append(written)
        serving_data = {
            CERT_KEY: desired.serving.cert_pem(),
            PRIVATE_KEY_KEY: desired.serving.key_pem(),
            CA_KEY: bundle_pem,
        }
        written = self._put_secret(settings.secret, snapshot.serving_secret, serving_data)
        if written:
            writes.append(written)
        if missing:
            raise StoreError(
                f"{' and '.join(missing)} not found, so its caBundle could not be set "
                f"(wrote: {', '.join(map(str, writes)) or 'nothing'}): run after the chart "
                "created the webhook configurations (a post-install/post-upgrade hook), or "
                "pass an empty name to leave that configuration alone"
            )
        return tuple(writes)

    def _put_secret(self, name: str, current: Json | None, data: dict[str, bytes]) -> Write | None:
        ref = self._secret_ref(name)
        encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
        if current is None:
            body: Json = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": name,
                    "namespace": self._settings.namespace,
                    "labels": dict(LABELS),
                },
                "type": SECRET_TYPE,
                "data": encoded,
            }
            self._call(
                f"create Secret {ref}",
                lambda: self._core.create_namespaced_secret(
                    self._settings.namespace,
                    body,
                    _preload_content=False,
                    _request_timeout=_TIMEOUT_S,
                ),
            )
            return Write("created", "Secret", ref)
        if all(_secret_value(current, key) == value for key, value in data.items()):
            return None
        if current.get("type") != SECRET_TYPE:
            raise StoreError(
                f"Secret {ref} has type {current.get('type')!r}, not {SECRET_TYPE!r}, and a "
                "Secret's type cannot change: delete it (it is recreated) or choose another name"
            )
        body = copy.deepcopy(current)
        body.setdefault("data", {}).update(encoded)
        body["metadata"].setdefault("labels", {}).update(LABELS)
        self._call(
            f"update Secret {ref}",
            lambda: self._core.replace_namespaced_secret(
                name,
                self._settings.namespace,
                body,
                _preload_content=False,
                _request_timeout=_TIMEOUT_S,
            ),
        )
        return Write("updated", "Secret", ref)

    def _put_ca_bundle(self, webhook: WebhookObject, bundle_pem: bytes) -> Write | None:
        assert webhook.body is not None
        entries = webhook.body.get("webhooks") or []
        if all(_entry_bundle(entry) == bundle_pem for entry in entries):
            return None
        body = copy.deepcopy(webhook.body)
        encoded = base64.b64encode(bundle_pem).decode()
        for entry in body["webhooks"]:
            entry.setdefault("clientConfig", {})["caBundle"] = encoded
        replace = (
            self._admission.replace_mutating_webhook_configuration
            if webhook.kind.startswith("Mutating")
            else self._admission.replace_validating_webhook_configuration
        )
        self._call(
            f"update {webhook.kind} {webhook.name}",
            lambda: replace(
                webhook.name, body, _preload_content=False, _request_timeout=_TIMEOUT_S
            ),
        )
        return Write("updated", webhook.kind, webhook.name)

    # --- plumbing -----------------------------------------------------------------------

    def _secret_ref(self, name: str) -> str:
        return f"{self._settings.namespace}/{name}"

    def _call(self, what: str, request: Any, missing_ok: bool = False) -> Json | None:
        try:
            response = request()
        except urllib3.exceptions.HTTPError as error:
            raise StoreError(f"cannot {what}: the API server is unreachable ({error})") from error
        except ApiException as error:
            if error.status == 404 and missing_ok:
                return None
            if error.status in (404, 409):
                # Created, changed or deleted by someone else since we read it.
                raise StoreConflictError(f"{what}: {error.status} {error.reason}") from error
            raise StoreError(_api_error_message(what, error)) from error
        decoded: Json = json.loads(response.data)
        return decoded


def _api_error_message(what: str, error: ApiException) -> str:
    detail = error.reason
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        detail = json.loads(error.body or "").get("message", detail)
    message = f"cannot {what}: HTTP {error.status}: {detail}"
    if error.status == 403:
        message += (
            " — the certs service account needs get/create/update on secrets in its "
            "namespace and get/update on mutatingwebhookconfigurations and "
            "validatingwebhookconfigurations"
        )
    return message


def _secret_value(secret: Json, key: str) -> bytes:
    value = (secret.get("data") or {}).get(key)
    return base64.b64decode(value) if value else b""


def _decode_pair(
    secret: Json | None, ref: str, problems: list[str]
) -> authority.CertKeyPair | None:
    if secret is None:
        return None
    try:
        return authority.decode_pair(
            _secret_value(secret, CERT_KEY), _secret_value(secret, PRIVATE_KEY_KEY), f"Secret {ref}"
        )
    except CertificateError as error:
        problems.append(f"{error} (it is replaced)")
        return None


def _entry_bundle(entry: Json) -> bytes:
    encoded = (entry.get("clientConfig") or {}).get("caBundle")
    return base64.b64decode(encoded) if encoded else b""


def _ca_bundles(body: Json | None) -> list[bytes]:
    if body is None:
        return []
    return [_entry_bundle(entry) for entry in body.get("webhooks") or []]


def _union(bundles: list[bytes]) -> tuple[x509.Certificate, ...]:
    """Every CA certificate in the bundles, first occurrence first; unreadable ones skipped."""
    seen: set[str] = set()
    result: list[x509.Certificate] = []
    for pem in bundles:
        if not pem:
            continue
        try:
            certs = authority.decode_certs(pem)
        except CertificateError as error:
            log.info("ignoring an unreadable caBundle/ca.crt (it is replaced): %s", error)
            continue
        for cert in certs:
            print_ = authority.fingerprint(cert)
            if print_ not in seen:
                seen.add(print_)
                result.append(cert)
    return tuple(result)
