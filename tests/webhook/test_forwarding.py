"""A replica that does not place forwards GPU pods to the leader, over real HTTPS."""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import jsonpatch
import pytest
import yaml

from fracgpu import codec
from fracgpu.model import Reservation
from fracgpu.names import ANNOTATION_ASSIGNMENT
from tests.webhook.support import (
    CLUSTER,
    Webhook,
    gpu_pod,
    plain_pod,
    start_webhook,
    stop_webhook,
    write_tls,
)
from webhook import settings
from webhook.cli.client import WebhookClient, build_review, patch_of
from webhook.serving import server
from webhook.serving.forward import LeaderForwarder
from webhook.serving.tls import CertificateReloader, TLSFiles
from webhook.state.backend import ForwardToLeader
from webhook.state.clusterfile import parse_cluster
from webhook.state.embedded import EmbeddedState

SHARE = {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"}


class FollowerState(EmbeddedState):
    """A replica's state that does not place: it knows only what was written, not what the
    leader holds in memory."""

    leader_url = ""

    def placing(self) -> bool:
        return False

    async def check_placing(self) -> None:
        raise ForwardToLeader(self.leader_url, "this replica is not the leader")

    async def reservation(self, reservation_id: str, node: str = "") -> Reservation | None:
        found = await super().reservation(reservation_id, node)
        if found is None:
            await self.check_placing()
        return found


def embedded() -> EmbeddedState:
    return EmbeddedState(parse_cluster(yaml.safe_dump(CLUSTER)), 10, 300)


def follower_state() -> FollowerState:
    return FollowerState(parse_cluster(yaml.safe_dump(CLUSTER)), 10, 300)


@dataclass
class Pair:
    leader: Webhook
    follower: server.RunningServer
    follower_state: FollowerState
    client: WebhookClient


async def start_follower(
    cert: Path, key: str | Path, ca: Path, state: FollowerState
) -> tuple[server.RunningServer, WebhookClient]:
    config = settings.from_mapping(
        {"host": "127.0.0.1", "port": "0", "tls_cert_file": str(cert), "tls_key_file": str(key)}
    )
    reloader = CertificateReloader(TLSFiles(cert, Path(key)), config.tls_reload_seconds)
    running = await server.start(
        config, state, reloader, LeaderForwarder(cert, identity="follower")
    )
    client = WebhookClient(running.url, ca)
    await client.__aenter__()
    return running, client


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    """A leader on the embedded state and a follower serving the same certificate."""
    leader = await start_webhook(
        tmp_path / "leader", EmbeddedState(parse_cluster(yaml.safe_dump(CLUSTER)), 10, 300)
    )
    state = follower_state()
    state.leader_url = leader.running.url
    running, client = await start_follower(leader.cert_file, leader.key_file, leader.ca_file, state)
    yield Pair(leader, running, state, client)
    await client.__aexit__(None, None, None)
    await running.stop()
    await stop_webhook(leader)


async def test_gpu_pods_are_placed_by_the_leader_and_validated_there(pair: Pair) -> None:
    pod = gpu_pod(SHARE, name="trainer")
    mutated = await pair.client.review("/mutate", build_review(pod))
    assert mutated.allowed and mutated.body["response"].get("patch"), mutated.body
    placed = jsonpatch.apply_patch(pod, patch_of(mutated.body))
    assignment = codec.decode_assignment(placed["metadata"]["annotations"][ANNOTATION_ASSIGNMENT])
    # The leader holds the reservation; the follower reserved nothing.
    assert await pair.leader.state.reservation(assignment.reservation_id) is not None
    assert await EmbeddedState.reservation(pair.follower_state, assignment.reservation_id) is None
    # Validation needs the leader too: only it knows the reservation.
    validated = await pair.client.review("/validate", build_review(placed))
    assert validated.allowed, validated.message


async def test_pods_without_gpus_are_answered_by_the_follower_itself(pair: Pair) -> None:
    await pair.leader.running.stop()  # no leader: a plain pod must not care
    reply = await pair.client.review("/mutate", build_review(plain_pod()))
    assert reply.allowed and reply.body["response"].get("patch")


async def test_a_forwarded_review_is_never_forwarded_again(pair: Pair) -> None:
    pair.follower_state.leader_url = pair.follower.url  # a stale Lease naming this replica
    reply = await pair.client.review("/mutate", build_review(gpu_pod(SHARE)))
    assert not reply.allowed
    assert reply.body["response"]["status"]["code"] == 503
    assert "create the pod again" in reply.message and "not the leader" in reply.message


async def test_an_unreachable_leader_fails_closed_with_a_message(pair: Pair) -> None:
    await pair.leader.running.stop()
    reply = await pair.client.review("/mutate", build_review(gpu_pod(SHARE)))
    assert not reply.allowed
    assert "did not answer" in reply.message and "create the pod again" in reply.message


async def test_no_known_leader_fails_closed_with_the_states_reason(pair: Pair) -> None:
    pair.follower_state.leader_url = ""
    reply = await pair.client.review("/mutate", build_review(gpu_pod(SHARE)))
    assert not reply.allowed
    assert "not the leader" in reply.message and "create the pod again" in reply.message


async def test_the_leader_must_present_this_replicas_certificate(tmp_path: Path) -> None:
    """A replica answering with another certificate (not from the shared Secret) gets no
    review: it could be anything on the network."""
    stranger = await start_webhook(tmp_path / "stranger", embedded())
    _, ca, cert, key = write_tls(tmp_path / "own")
    state = follower_state()
    state.leader_url = stranger.running.url
    running, client = await start_follower(cert, key, ca, state)
    try:
        reply = await client.review("/mutate", build_review(gpu_pod(SHARE)))
        assert not reply.allowed
        assert "does not present this replica's certificate" in reply.message
        stranger_view = await stranger.state.view()
        assert stranger_view.gpu_free("node-a", "GPU-aaaa-0000")[0] == 100
    finally:
        await client.__aexit__(None, None, None)
        await running.stop()
        await stop_webhook(stranger)


async def test_only_the_placing_replica_reports_placing_and_forwards_are_counted(
    pair: Pair,
) -> None:
    await pair.client.review("/mutate", build_review(gpu_pod(SHARE)))
    _, follower_text = await pair.client.get("/metrics")
    _, leader_text = await pair.leader.client.get("/metrics")
    assert "fracgpu_webhook_placing 0.0" in follower_text
    assert "fracgpu_webhook_placing 1.0" in leader_text
    assert 'fracgpu_webhook_admissions_total{endpoint="mutate",verdict="forwarded"} 1.0' in (
        follower_text
    )
    assert 'fracgpu_webhook_admissions_total{endpoint="mutate",verdict="patched"} 1.0' in (
        leader_text
    )


async def test_forwarded_reviews_share_one_connection_to_the_leader(pair: Pair) -> None:
    """A TLS connection per forwarded review would cost a handshake each and pile up kept-
    alive connections on both sides (seen as tens of MiB in the churn test)."""
    small = {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "1"}
    for i in range(20):
        reply = await pair.client.review("/mutate", build_review(gpu_pod(small, name=f"p{i}")))
        assert reply.allowed, reply.message
    server = pair.leader.running.runner.server
    assert server is not None
    assert len(server.connections) == 1
