"""The cluster back end's leader side, without an API server: claims held in memory, counted
at once, dropped when their pod appears; followers are told where the leader is."""

from collections.abc import Awaitable, Callable

import pytest

from fracgpu.model import ContainerRequest, MemoryRequest
from fracgpu.placement import Constraints, NoFit, PodDemand, Policy
from tests.webhook.test_cluster_bookkeeping import (
    TTL,
    free,
    gpunode,
    held,
    kube_settings,
    node,
    placed_pod,
)
from webhook.cluster.apiclient import Endpoint, KubeApi
from webhook.cluster.kubestate import KubeState
from webhook.cluster.leader import Leadership
from webhook.state.backend import Claim, ForwardToLeader, RejectKind, ReserveRejected

NOW = 1_000.0


def state_with(
    leadership: Leadership, find_leader: Callable[[], Awaitable[str]] | None = None
) -> KubeState:
    # never opened: the caches are fed directly and reserve() makes no API call
    state = KubeState(
        KubeApi(Endpoint("https://127.0.0.1:1")),
        kube_settings(reservation_ttl_s=TTL),
        clock=lambda: NOW,
        leadership=leadership,
        find_leader=find_leader,
    )
    state.nodes.put(node("n1"))
    state.gpunodes.put(gpunode("n1", "1", []))
    return state


def leader() -> Leadership:
    return Leadership(clock=lambda: NOW, placing_from=NOW, valid_until=NOW + 10)


def claim(rid: str, gpu: int, cores: int) -> Claim:
    return Claim(held(rid, "n1", gpu, cores, 0), 0, 0, {f"n1-g{gpu}": "T4"})


async def test_a_claim_counts_at_once_and_is_dropped_unwritten_when_its_pod_appears() -> None:
    state = state_with(leader())
    await state.reserve(claim("r1", 0, 60))
    assert (await free(state, "n1"))[0][0] == 40
    assert state.ledger.unwritten() == 1
    found = await state.reservation("r1", "n1")
    assert found is not None and found.expires_at == int(NOW) + TTL
    with pytest.raises(ReserveRejected) as full:
        await state.reserve(claim("r2", 0, 50))
    assert full.value.kind is RejectKind.CAPACITY
    # The pod is stored: it holds the slice now, counted once, and nothing is left to write.
    state.pods.put(placed_pod("p1", "r1", "n1", 0, 60))
    assert state.ledger.unwritten() == 0
    assert (await free(state, "n1"))[0][0] == 40
    assert await state.reservation("r1", "n1") is None  # a second pod with it copied it


async def test_quota_counts_charges_not_yet_written() -> None:
    state = state_with(leader())
    state.gpuquotas.put(
        {
            "metadata": {"namespace": "team", "name": "gpu", "resourceVersion": "1"},
            "spec": {"hard": {"cores": 100}},
        }
    )
    await state.reserve(claim("r1", 0, 60))
    (counted,) = await state.quotas("team")
    assert counted.used.cores == 60
    with pytest.raises(ReserveRejected) as over:
        await state.reserve(claim("r2", 1, 50))
    assert over.value.kind is RejectKind.QUOTA and "team/gpu" in over.value.message
    assert list(state.ledger.unwritten_charges()) == ["team/gpu"]


async def test_a_follower_points_at_the_leader_or_says_none_is_known() -> None:
    follower = state_with(Leadership(clock=lambda: NOW, leader_url="https://leader:8443"))
    with pytest.raises(ForwardToLeader) as where:
        await follower.reserve(claim("r1", 0, 10))
    assert where.value.leader_url == "https://leader:8443"
    assert (await free(follower, "n1"))[0][0] == 100  # nothing held here

    asked: list[str] = []

    async def nobody() -> str:
        asked.append("lease")
        return ""

    lost = state_with(Leadership(clock=lambda: NOW), find_leader=nobody)
    with pytest.raises(ForwardToLeader) as where:
        await lost.check_placing()
    assert where.value.leader_url == "" and "no leader is known" in where.value.reason
    assert asked == ["lease"]  # it read the Lease before giving up


async def test_a_leader_in_its_takeover_wait_or_past_its_deadline_does_not_place() -> None:
    waiting = state_with(Leadership(clock=lambda: NOW, placing_from=NOW + 12, valid_until=NOW + 10))
    with pytest.raises(ForwardToLeader) as where:
        await waiting.check_placing()
    assert where.value.leader_url == "" and "places pods in 12 s" in where.value.reason
    stale = state_with(Leadership(clock=lambda: NOW, placing_from=NOW - 20, valid_until=NOW))
    with pytest.raises(ForwardToLeader) as where:
        await stale.reserve(claim("r1", 0, 10))
    assert "could not renew" in where.value.reason
    assert not stale.placing() and state_with(leader()).placing()


async def test_only_claims_older_than_the_write_behind_window_are_written() -> None:
    """A claim whose pod may still appear is not written; the API here is unreachable, so a
    round that tries to write reports a failure."""
    now = [NOW]
    leadership = Leadership(clock=lambda: now[0], placing_from=NOW, valid_until=NOW + 60)
    unreachable = KubeApi(Endpoint("https://127.0.0.1:1"))
    state = KubeState(
        unreachable,
        kube_settings(reservation_ttl_s=TTL, write_behind_s=0.2),
        clock=lambda: now[0],
        leadership=leadership,
    )
    state.nodes.put(node("n1"))
    state.gpunodes.put(gpunode("n1", "1", []))
    await state.reserve(claim("r1", 0, 10))
    now[0] += 0.1
    assert await state.writer.write_pending(), "a young claim must not be written yet"
    assert state.ledger.unwritten() == 1
    now[0] += 0.2
    async with unreachable:
        assert not await state.writer.write_pending(), "an old claim is written (and fails here)"
    assert state.ledger.unwritten() == 1  # kept for the next round


async def test_a_gpunode_without_its_node_takes_no_pods_until_the_node_appears() -> None:
    state = state_with(leader())
    state.gpunodes.put(gpunode("orphan", "1", []))  # the agent's object; no Node of that name
    view = await state.view()
    assert [n.name for n in view.nodes()] == ["n1"]
    request = ContainerRequest("main", 1, 10, MemoryRequest(mib=1024))
    only_orphan = Constraints(include_uuids=("orphan-g0", "orphan-g1"))
    assert isinstance(
        view.place(PodDemand((request,), constraints=only_orphan), Policy.BINPACK), NoFit
    )
    state.nodes.put(node("orphan"))
    view = await state.view()
    assert sorted(n.name for n in view.nodes()) == ["n1", "orphan"]
    placed = view.place(PodDemand((request,), constraints=only_orphan), Policy.BINPACK)
    assert not isinstance(placed, NoFit) and placed.node == "orphan"
    # The Node is deleted (the GPUNode stays until its agent or an admin removes it).
    state.nodes._apply({"type": "DELETED", "object": node("orphan")}, "2")
    view = await state.view()
    assert [n.name for n in view.nodes()] == ["n1"]
