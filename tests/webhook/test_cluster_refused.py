"""The cluster back end gives back a reservation whose pod a later admission step refused,
without an API server for the paths that need none (the confirmed-but-absent path reads the
pod from storage: tests/e2e/test_refused_release_e2e.py)."""

import pytest

from fracgpu.model import Reservation
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
from webhook.state.backend import Claim, ForwardToLeader, ReserveRejected

START = 1_000.0
WINDOW_S = 5.0


def state_at(now: list[float], leadership: Leadership | None = None) -> KubeState:
    # never opened: the caches are fed directly; these paths make no API call
    state = KubeState(
        KubeApi(Endpoint("https://127.0.0.1:1")),
        kube_settings(reservation_ttl_s=TTL, admission_window_s=WINDOW_S),
        clock=lambda: now[0],
        leadership=leadership
        or Leadership(clock=lambda: now[0], placing_from=START, valid_until=START + 10**6),
    )
    state.nodes.put(node("n1"))
    state.gpunodes.put(gpunode("n1", "1", []))
    return state


def claim(rid: str, cores: int) -> Claim:
    return Claim(held(rid, "n1", 0, cores, 0), 0, 0, {"n1-g0": "T4"})


async def test_an_unconfirmed_reservation_is_given_back_after_the_window() -> None:
    now = [START]
    state = state_at(now)
    await state.reserve(claim("r1", 60))
    now[0] += WINDOW_S - 1
    assert await state.release_refused() == 0
    assert (await free(state, "n1"))[0][0] == 40
    now[0] += 2  # past the window, far below the TTL
    assert await state.release_refused() == 1
    assert (await free(state, "n1"))[0][0] == 100
    assert await state.reservation("r1", "") is None  # a late validation finds nothing
    assert state.ledger.awaiting_admission() == (0, 0)


async def test_a_confirmed_or_stored_reservation_is_not_given_back_unread() -> None:
    now = [START]
    state = state_at(now)
    await state.reserve(claim("r1", 60))
    await state.reserve(claim("r2", 30))
    await state.confirm("r1", "p1")
    assert state.ledger.awaiting_admission() == (1, 1)
    state.pods.put(placed_pod("p2", "r2", "n1", 0, 30))  # r2's pod is stored
    state.pods.put(placed_pod("p1", "r1", "n1", 0, 60))  # and r1's
    now[0] += WINDOW_S * 10
    assert state.ledger.awaiting_admission() == (0, 0)
    assert await state.release_refused() == 0
    assert (await free(state, "n1"))[0][0] == 10


async def test_a_follower_forwards_the_confirmation_to_the_leader() -> None:
    now = [START]
    follower = state_at(now, Leadership(clock=lambda: now[0], leader_url="https://leader:8443"))
    with pytest.raises(ForwardToLeader) as where:
        await follower.confirm("r1", "p1")
    assert where.value.leader_url == "https://leader:8443"


async def test_one_reservation_id_places_one_pod() -> None:
    """A queued entry copied onto a second pod carries the original's reservation ID: the
    first bind to reserve GPUs with it wins, and a second pod's reservation under the same
    ID is refused, whether the first is still in flight or already a live pod."""
    now = [START]
    state = state_at(now)
    first = claim("r1", 30)
    await state.reserve(first)
    copy = Claim(
        Reservation("r1", "n1", "team", "zcopy", held("r1", "n1", 1, 30, 0).allocations, 0),
        0,
        0,
        {"n1-g1": "T4"},
    )
    with pytest.raises(ReserveRejected, match="one reservation ID places one pod"):
        await state.reserve(copy)
    assert (await free(state, "n1"))[1][0] == 100  # the copy took nothing
    state.ledger.drop("r1")
    state.pods.put(placed_pod("p1", "r1", "n1", 0, 30))  # the first is a live pod now
    with pytest.raises(ReserveRejected, match="already placed pod team/p1"):
        await state.reserve(copy)
