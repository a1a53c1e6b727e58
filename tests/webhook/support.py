"""Shared test data and helpers: a small cluster, pod builders, a running HTTPS webhook."""

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jsonpatch
import yaml

from webhook import settings
from webhook.cli import selfsigned
from webhook.cli.client import Reply, WebhookClient, build_review, patch_of
from webhook.serving import server
from webhook.serving.tls import CertificateReloader, TLSFiles
from webhook.state.clusterfile import parse_cluster
from webhook.state.embedded import EmbeddedState

A100: Final = "NVIDIA A100-SXM4-40GB"
T4: Final = "Tesla T4"
A100_0: Final = "GPU-aaaa-0000"
A100_1: Final = "GPU-aaaa-0001"
T4_0: Final = "GPU-tttt-0000"
WEBHOOK_SA: Final = "system:serviceaccount:fracgpu-system:fracgpu-webhook"

CLUSTER: Final[dict[str, Any]] = {
    "nodes": [
        {
            "name": "node-a",
            "cpu": "32",
            "memory": "128Gi",
            "labels": {"kubernetes.io/os": "linux", "topology.kubernetes.io/zone": "a"},
            "gpus": [
                {"uuid": A100_0, "index": 0, "model": A100, "memoryMiB": 40960},
                {"uuid": A100_1, "index": 1, "model": A100, "memoryMiB": 40960},
            ],
        },
        {
            "name": "node-t",
            "cpu": "8",
            "memory": "32Gi",
            "labels": {"kubernetes.io/os": "linux", "topology.kubernetes.io/zone": "b"},
            "gpus": [{"uuid": T4_0, "index": 0, "model": T4, "memoryMiB": 15360}],
        },
    ],
    "namespaces": [{"name": "skip", "labels": {"fracgpu.io/ignore": "true"}}],
    "quotas": [
        {
            "metadata": {"namespace": "limited", "name": "small"},
            "spec": {"hard": {"cores": 50, "memoryMiB": 8192, "gpus": 0}},
        },
        {
            "metadata": {"namespace": "wholes", "name": "whole-gpus"},
            "spec": {"hard": {"gpus": 1}},
        },
        {
            "metadata": {"namespace": "models", "name": "per-model"},
            "spec": {"models": {"A100": {"cores": 20}}},
        },
        {
            "metadata": {"namespace": "granted", "name": "grants"},
            "spec": {"grants": {"priority": "high"}},
        },
    ],
}


def cluster_state(
    cluster: Mapping[str, Any] = CLUSTER, split_count: int = 10, memory_scaling: float = 1.0
) -> EmbeddedState:
    return EmbeddedState(
        parse_cluster(yaml.safe_dump(dict(cluster))),
        split_count,
        300,
        memory_scaling=memory_scaling,
    )


def gpu_pod(
    limits: Mapping[str, Any],
    *,
    name: str = "p",
    namespace: str = "team",
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    env: list[dict[str, Any]] | None = None,
    extra_containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    affinity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "cuda",
        "resources": {"limits": dict(limits)},
    }
    if env is not None:
        container["env"] = env
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    spec: dict[str, Any] = {"containers": [container, *(extra_containers or [])]}
    if init_containers:
        spec["initContainers"] = init_containers
    if affinity:
        spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def plain_pod(name: str = "web", namespace: str = "team") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "nginx", "image": "nginx"}]},
    }


@dataclass
class Admitted:
    """The result of sending a pod through /mutate then (if allowed) /validate."""

    mutate: Reply
    validate: Reply | None
    pod: dict[str, Any]

    @property
    def allowed(self) -> bool:
        return self.mutate.allowed and self.validate is not None and self.validate.allowed

    @property
    def message(self) -> str:
        if not self.mutate.allowed:
            return self.mutate.message
        return self.validate.message if self.validate is not None else ""


@dataclass
class Webhook:
    """A running HTTPS webhook and a client that trusts its CA."""

    running: server.RunningServer
    client: WebhookClient
    state: EmbeddedState
    ca_file: Path
    cert_file: Path
    key_file: Path

    async def admit(
        self, pod: Mapping[str, Any], *, username: str = "alice", dry_run: bool = False
    ) -> Admitted:
        mutated = await self.client.review(
            "/mutate", build_review(pod, username=username, dry_run=dry_run)
        )
        if not mutated.allowed:
            return Admitted(mutated, None, copy.deepcopy(dict(pod)))
        patched = jsonpatch.apply_patch(dict(pod), patch_of(mutated.body))
        validated = await self.client.review(
            "/validate", build_review(patched, username=username, dry_run=dry_run)
        )
        return Admitted(mutated, validated, patched)


def write_tls(directory: Path) -> tuple[selfsigned.Authority, Path, Path, Path]:
    authority = selfsigned.new_authority()
    ca, cert, key = selfsigned.write_files(
        directory, authority, selfsigned.issue_serving(authority)
    )
    return authority, ca, cert, key


async def start_webhook(directory: Path, state: EmbeddedState, **overrides: str) -> Webhook:
    _, ca, cert, key = write_tls(directory)
    config = settings.from_mapping(
        {"host": "127.0.0.1", "port": "0", "tls_cert_file": str(cert), "tls_key_file": str(key)}
        | overrides
    )
    reloader = CertificateReloader(TLSFiles(cert, key), config.tls_reload_seconds)
    running = await server.start(config, state, reloader)
    client = WebhookClient(running.url, ca)
    await client.__aenter__()
    return Webhook(running, client, state, ca, cert, key)


async def stop_webhook(hook: Webhook) -> None:
    await hook.client.__aexit__(None, None, None)
    await hook.running.stop()
