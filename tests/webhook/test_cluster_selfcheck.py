"""The leader's self-check finds drift between its bookkeeping and a recount from the caches,
logs where, counts it for /metrics and repairs it; claims still in flight are kept.
(Against the real API server: tests/e2e/test_selfcheck_e2e.py.)"""

import asyncio
import logging

import pytest

from tests.webhook.test_cluster_bookkeeping import (
    TTL,
    cluster_state,
    free,
    gpunode,
    held,
    node,
    placed_pod,
)
from webhook.cluster import selfcheck
from webhook.cluster.kubestate import KubeState
from webhook.metrics import Metrics
from webhook.state.backend import Claim

NOW = 1_000.0


def one_node(now: list[float]) -> KubeState:
    state = cluster_state(now)
    state.nodes.put(node("n1"))
    state.gpunodes.put(gpunode("n1", "1", [held("w1", "n1", 1, 20, now[0] + TTL)]))
    return state


def fresh_replica(now: list[float], state: KubeState) -> KubeState:
    """A replica that learnt everything from the caches alone: what a recount counts."""
    fresh = cluster_state(now)
    for _, record in state.nodes.items():
        fresh.nodes.put(node(record.name))
    fresh.gpunodes.put(gpunode("n1", "1", [held("w1", "n1", 1, 20, now[0] + TTL)]))
    return fresh


async def test_consistent_bookkeeping_has_no_drift() -> None:
    """No false alarms: pods, written reservations, a claim in flight inside its TTL, and a
    reservation that expired since the node was last counted are all as they should be."""
    now = [NOW]
    state = one_node(now)
    state.pods.put(placed_pod("p1", "r1", "n1", 0, 30))
    in_flight = Claim(held("r2", "n1", 0, 10, now[0] + TTL), 500, 256)
    state.ledger.hold(in_flight, (), now[0])
    state.sync.allocate(in_flight)
    await state.view()
    now[0] += TTL + 1  # w1 expires; nothing touched n1 since, so the view still counts it
    in_flight_again = Claim(held("r3", "n1", 0, 10, now[0] + TTL), 0, 0)
    state.ledger.hold(in_flight_again, (), now[0])
    state.sync.allocate(in_flight_again)
    assert state.self_check.check_once() == []
    assert state.drift_counts().checks == 1
    assert sum(state.drift_counts().repairs.values()) == 0


async def test_use_counted_in_the_view_but_held_by_nothing_is_recounted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [NOW]
    state = one_node(now)
    before = await free(state, "n1")
    # A claim that reached the view but not the ledger (lost in between): nothing will ever
    # give it back, and no event touches n1.
    leaked = Claim(held("lost", "n1", 0, 30, now[0] + TTL), 1000, 512)
    state.sync.allocate(leaked)
    assert await free(state, "n1") != before
    with caplog.at_level(logging.WARNING, logger="webhook.cluster.selfcheck"):
        drifts = state.self_check.check_once()
    assert {(d.kind, d.where) for d in drifts} == {
        ("gpu", "node n1 GPU n1-g0"),
        ("node-use", "node n1"),
    }
    gpu = next(d for d in drifts if d.kind == "gpu")
    assert gpu.ledger == "counts 30 cores, 1024 MiB, 1 containers"
    assert gpu.recount == "counts 0 cores, 0 MiB, 0 containers"
    assert "node n1 GPU n1-g0: ledger: counts 30 cores" in caplog.text
    assert await free(state, "n1") == before == await free(fresh_replica(now, state), "n1")
    counts = state.drift_counts()
    assert counts.repairs["gpu"] == 1 and counts.drifted["gpu"] == 1
    assert state.self_check.check_once() == []  # repaired: the next check finds nothing
    assert state.drift_counts().drifted["gpu"] == 0
    assert state.drift_counts().repairs["gpu"] == 1


async def test_a_pod_that_liveness_lost_is_followed_again() -> None:
    """Liveness missed that the pod of reservation w1 is live: w1 would hold its slice as
    well as the pod, and the pod's CPU would not be counted."""
    now = [NOW]
    state = one_node(now)
    state.pods.put(placed_pod("p1", "w1", "n1", 1, 20))
    expected = await free(state, "n1")
    state.liveness.forget_pod("team/p1", departed=False)
    state.sync.changed("n1")  # any later event on n1 recounts it wrongly
    assert await free(state, "n1") != expected
    drifts = state.self_check.check_once()
    assert next((d.kind, d.where, d.ledger, d.recount) for d in drifts) == (
        "pod",
        "namespace team pod team/p1",
        "not live",
        "live on node n1 with reservation w1",
    )
    assert state.liveness.is_live("w1")
    assert await free(state, "n1") == expected


async def test_a_leaked_claim_is_dropped_and_a_claim_in_flight_is_kept() -> None:
    now = [NOW]
    state = one_node(now)
    state.pods.put(placed_pod("p1", "r1", "n1", 0, 30))
    # The ledger holds r1 again after its pod appeared (a claim leaked), and r2, whose pod
    # may not be visible yet.
    state.ledger.hold(Claim(held("r1", "n1", 0, 30, now[0] + TTL), 2000, 0), (), now[0])
    in_flight = Claim(held("r2", "n1", 0, 10, now[0] + TTL), 0, 0)
    state.ledger.hold(in_flight, (), now[0])
    state.sync.allocate(in_flight)
    drifts = state.self_check.check_once()
    found = {(d.kind, d.where, d.recount) for d in drifts}
    assert found == {
        ("claim", "namespace team claim r1 on node n1", "its pod is live"),
        ("window", "reservation r1", "its pod is live"),
    }
    assert state.ledger.inflight("r1") is None
    assert state.ledger.inflight("r2") is not None
    assert state.ledger.awaiting_admission() == (1, 0)  # r2 still waits for validation
    assert (await free(state, "n1"))[0][0] == 100 - 30 - 10  # the pod and r2


async def test_metrics_export_the_checks_and_repairs() -> None:
    now = [NOW]
    state = one_node(now)
    metrics = Metrics()
    metrics.watch_drift(state.drift_counts)
    await state.view()
    state.sync.allocate(Claim(held("lost", "n1", 0, 30, now[0] + TTL), 0, 0))
    state.self_check.check_once()
    text = metrics.exposition().decode()
    assert "fracgpu_webhook_state_self_checks_total 1.0" in text
    assert 'fracgpu_webhook_state_drift_repairs_total{kind="gpu"} 1.0' in text
    assert 'fracgpu_webhook_state_drifted_items{kind="gpu"} 1.0' in text
    assert 'fracgpu_webhook_state_drift_repairs_total{kind="claim"} 0.0' in text


async def test_the_periodic_check_lets_admissions_run_between_batches_of_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [NOW]
    state = cluster_state(now)
    for name in ("n1", "n2", "n3"):
        state.nodes.put(node(name))
        state.gpunodes.put(gpunode(name, "1", []))
    await state.view()
    state.sync.allocate(Claim(held("lost", "n3", 0, 30, now[0] + TTL), 0, 0))
    monkeypatch.setattr(selfcheck, "NODES_PER_STEP", 1)
    ran_meanwhile = []

    async def admission() -> None:
        for _ in range(3):
            ran_meanwhile.append(state.drift_counts().checks)
            await asyncio.sleep(0)

    drifts, _ = await asyncio.gather(state.self_check.check(), admission())
    assert {(d.kind, d.where) for d in drifts} == {("gpu", "node n3 GPU n3-g0")}
    assert ran_meanwhile == [0, 0, 0]  # all while the check was under way
    assert state.drift_counts().repairs["gpu"] == 1


async def test_a_node_the_view_lost_is_counted_again() -> None:
    now = [NOW]
    state = one_node(now)
    before = await free(state, "n1")
    (await state.view()).remove_node("n1")  # as if its GPUNode event had been mishandled
    assert (await state.view()).inventory("n1") is None
    drifts = state.self_check.check_once()
    assert [(d.kind, d.where, d.ledger, d.recount) for d in drifts] == [
        ("node", "node n1", "lacks the node", "has it")
    ]
    assert await free(state, "n1") == before
