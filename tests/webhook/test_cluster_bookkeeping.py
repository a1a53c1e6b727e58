"""The cluster back end's per-pod bookkeeping stays bounded by one reservation TTL."""

from dataclasses import replace
from typing import Any

import pytest

from fracgpu import codec, names
from fracgpu.model import Assignment, ContainerAssignment, GPUAllocation, Reservation
from fracgpu.placement import ClusterView
from webhook.cluster.apiclient import Endpoint, KubeApi
from webhook.cluster.kubestate import KubeState, KubeStateSettings
from webhook.cluster.ledger import ClaimLedger
from webhook.settings import Settings
from webhook.state.backend import Claim

TTL = 60


def kube_settings(**overrides: Any) -> KubeStateSettings:
    """The cluster back end's settings as the webhook's defaults make them, then these."""
    return replace(KubeStateSettings.from_settings(Settings()), **overrides)


def pod(name: str, reservation: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "annotations": {names.ANNOTATION_RESERVATION_ID: reservation},
        },
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "main"}]},
        "status": {"phase": phase},
    }


def test_departed_reservations_are_forgotten_after_one_ttl_on_every_replica() -> None:
    now = [1_000.0]
    # never opened: these tests feed the caches directly and make no API call
    state = KubeState(
        KubeApi(Endpoint("https://127.0.0.1:1")),
        kube_settings(reservation_ttl_s=TTL),
        clock=lambda: now[0],
    )
    for i in range(200):
        state.pods.put(pod(f"p{i}", f"r{i}"))
        state.pods.put(pod(f"p{i}", f"r{i}", phase="Succeeded"))  # the pod finishes
        now[0] += 1.0
    departed, _ = state.bookkeeping_sizes()
    # only what departed within the last TTL (plus one amortisation step) is remembered
    assert departed <= TTL + TTL // 4 + 1
    assert "r199" in state.departed_reservation_ids()
    assert "r0" not in state.departed_reservation_ids()


def cluster_state(now: list[float], settle_s: float = 5.0) -> KubeState:
    # never opened: the caches are fed directly and no API call is made
    return KubeState(
        KubeApi(Endpoint("https://127.0.0.1:1")),
        kube_settings(reservation_ttl_s=TTL, settle_s=settle_s),
        clock=lambda: now[0],
    )


def gpunode(name: str, version: str, reservations: list[Reservation]) -> dict[str, Any]:
    devices = [
        {"uuid": f"{name}-g{i}", "index": i, "model": "T4", "memoryMiB": 16384, "healthy": True}
        for i in range(2)
    ]
    return {
        "metadata": {"name": name, "resourceVersion": version},
        "status": {
            "devices": devices,
            "reservations": [codec.encode_reservation(r) for r in reservations],
        },
    }


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}}


def held(rid: str, node_name: str, gpu: int, cores: int, expires_at: float) -> Reservation:
    allocation = GPUAllocation(f"{node_name}-g{gpu}", cores, 1024)
    return Reservation(rid, node_name, "team", "", (allocation,), int(expires_at))


def placed_pod(name: str, rid: str, node_name: str, gpu: int, cores: int) -> dict[str, Any]:
    assignment = Assignment(
        node_name,
        rid,
        (ContainerAssignment("main", (GPUAllocation(f"{node_name}-g{gpu}", cores, 1024),)),),
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "annotations": {
                names.ANNOTATION_ASSIGNMENT: codec.encode_assignment(assignment),
                names.ANNOTATION_RESERVATION_ID: rid,
            },
        },
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "main", "resources": {"requests": {"cpu": "2"}}}],
        },
        "status": {"phase": "Running"},
    }


async def free(state: KubeState, name: str) -> list[tuple[int, int, int]]:
    view = await state.view()
    return [view.gpu_free(name, f"{name}-g{i}") for i in range(2)] + [(*view.node_free(name), 0)]


async def test_view_recounts_a_changed_node_like_a_fresh_replica() -> None:
    now = [1_000.0]
    later = now[0] + TTL
    first = [held("r1", "n1", 0, 30, later), held("r2", "n1", 1, 50, later)]
    final = [held("r2", "n1", 1, 50, later), held("r3", "n1", 0, 20, later)]
    running = cluster_state(now)
    running.nodes.put(node("n1"))
    running.nodes.put(node("n2"))
    running.gpunodes.put(gpunode("n1", "1", first))
    running.gpunodes.put(gpunode("n2", "1", []))
    assert await free(running, "n1") == [(70, 15360, 1), (50, 15360, 1), (8000, 32768, 0)]
    # the reservations change and a pod of r2 appears: only counted once
    running.gpunodes.put(gpunode("n1", "2", final))
    running.pods.put(placed_pod("p2", "r2", "n1", 1, 50))
    fresh = cluster_state(now)
    fresh.nodes.put(node("n1"))
    fresh.nodes.put(node("n2"))
    fresh.gpunodes.put(gpunode("n1", "2", final))
    fresh.gpunodes.put(gpunode("n2", "1", []))
    fresh.pods.put(placed_pod("p2", "r2", "n1", 1, 50))
    expected = [(80, 15360, 1), (50, 15360, 1), (6000, 32768, 0)]
    assert await free(running, "n1") == await free(fresh, "n1") == expected
    assert await free(running, "n2") == await free(fresh, "n2")


def test_prunable_reservations_settled_expired_or_departed() -> None:
    now = [1_000.0]
    state = cluster_state(now, settle_s=5.0)
    expires = now[0] - 10 + TTL  # made 10 s ago; its pod shows up only now
    state.pods.put(placed_pod("live", "r-live", "n1", 0, 10))
    state.pods.put(placed_pod("gone", "r-gone", "n1", 0, 10))
    state.pods.put({**placed_pod("gone", "r-gone", "n1", 0, 10), "status": {"phase": "Failed"}})
    live, gone = held("r-live", "n1", 0, 10, expires), held("r-gone", "n1", 0, 10, expires)
    waiting = held("r-wait", "n1", 0, 10, expires)
    # the settle time runs from the pod's appearance: other replicas may not see it yet
    assert not state.liveness.prunable(live, now[0] + 4.9)
    now[0] += 3.0
    state.pods.put({**placed_pod("live", "r-live", "n1", 0, 10), "status": {"phase": "Pending"}})
    assert not state.liveness.prunable(
        live, now[0] + 1.9
    )  # an update of the pod does not restart it
    assert state.liveness.prunable(live, now[0] + 2.0)
    assert state.liveness.prunable(gone, now[0])
    assert not state.liveness.prunable(waiting, expires - 1)
    assert state.liveness.prunable(waiting, expires)


def test_changed_nodes_are_taken_once() -> None:
    now = [1_000.0]
    state = cluster_state(now)
    state.gpunodes.put(gpunode("n1", "1", []))
    assert state.sync.take_changed_nodes() is None  # the first round looks at every node
    state.gpunodes.put(gpunode("n2", "1", []))
    state.pods.put(placed_pod("p", "r", "n1", 0, 10))
    assert state.sync.take_changed_nodes() == {"n1", "n2"}
    assert state.sync.take_changed_nodes() == set()
    state.sync.requeue_changed_nodes(["n2"])
    assert state.sync.take_changed_nodes() == {"n2"}


def test_an_object_version_already_cached_is_not_decoded_again() -> None:
    now = [1_000.0]
    state = cluster_state(now)
    seen: list[str] = []
    state.gpunodes.add_listener(lambda key, old, new: seen.append(key))
    state.gpunodes.put(gpunode("n1", "7", []))
    later = now[0] + TTL
    # the same version with other content cannot happen in the API; it proves no re-decode
    state.gpunodes.put(gpunode("n1", "7", [held("r1", "n1", 0, 10, later)]))
    record = state.gpunodes.get("n1")
    assert record is not None and record.reservations == () and seen == ["n1"]
    state.gpunodes.put(gpunode("n1", "8", [held("r1", "n1", 0, 10, later)]))
    record = state.gpunodes.get("n1")
    assert record is not None and len(record.reservations) == 1 and seen == ["n1", "n1"]


def test_a_written_gpunode_is_cached_as_written_without_decoding_the_answer() -> None:
    now = [1_000.0]
    state = cluster_state(now)
    state.gpunodes.put(gpunode("n1", "3", []))
    record = state.gpunodes.get("n1")
    assert record is not None
    mine = held("r1", "n1", 0, 10, now[0] + TTL)
    # the API server's answer to the guarded patch: the object at its new version
    state.writer.store_written(record, gpunode("n1", "4", [mine]), (mine,))
    cached = state.gpunodes.get("n1")
    assert cached is not None
    assert (cached.resource_version, cached.reservations, cached.devices) == (
        "4",
        (mine,),
        record.devices,
    )
    assert cached == replace(record, resource_version="4", reservations=(mine,))
    # equal to decoding the answer, which the watch event of that version would do
    decoded = cluster_state(now)
    decoded.gpunodes.put(gpunode("n1", "4", [mine]))
    assert decoded.gpunodes.get("n1") == cached


async def one_counted_node(now: list[float]) -> KubeState:
    """A replica's state with GPU node n1 (no pods, no reservations), counted once."""
    state = cluster_state(now)
    state.nodes.put(node("n1"))
    state.gpunodes.put(gpunode("n1", "1", []))
    await state.view()
    return state


def record_recounts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The nodes the view recounts from now on, in order (recounting them as before)."""
    recounted: list[str] = []
    recount = ClusterView.set_usage
    monkeypatch.setattr(
        ClusterView,
        "set_usage",
        lambda view, name, uses: (recounted.append(name), recount(view, name, uses)),
    )
    return recounted


async def test_a_gpunode_update_that_changes_nothing_counted_is_not_recounted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1_000.0]
    state = await one_counted_node(now)
    recounted = record_recounts(monkeypatch)
    # the leader's own summary write: a new version, status.summary changed, nothing counted
    published = gpunode("n1", "2", [])
    published["status"]["summary"] = {"sharedGPUs": 0}
    state.gpunodes.put(published)
    await state.view()
    assert recounted == []
    later = now[0] + TTL
    state.gpunodes.put(gpunode("n1", "3", [held("r1", "n1", 0, 30, later)]))
    assert await free(state, "n1") == [(70, 15360, 1), (100, 16384, 0), (8000, 32768, 0)]
    assert recounted == ["n1"]


@pytest.mark.parametrize(
    ("pod_cpu", "recounts"), [("2", []), ("3", ["n1"])], ids=["as-claimed", "more-cpu"]
)
async def test_a_pod_that_takes_over_its_claim_is_not_recounted(
    pod_cpu: str, recounts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim admitted for a pod is counted from admission on; when the pod appears with
    exactly what was claimed, the view already counts it. A pod that holds more (here CPU,
    as another webhook could have set) is recounted. Either way the view ends up counting
    what a fresh replica counts."""
    now = [1_000.0]
    state = await one_counted_node(now)
    reservation = held("r1", "n1", 0, 30, now[0] + TTL)
    claim = Claim(reservation, 2000, 0)
    state.ledger.hold(claim, (), now[0])
    state.sync.allocate(claim)
    recounted = record_recounts(monkeypatch)
    pod = placed_pod("p1", "r1", "n1", 0, 30)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = pod_cpu
    state.pods.put(pod)
    running = await free(state, "n1")
    assert recounted == recounts
    fresh = cluster_state(now)
    fresh.nodes.put(node("n1"))
    fresh.gpunodes.put(gpunode("n1", "1", []))
    fresh.pods.put(pod)
    assert running == await free(fresh, "n1")
    assert running[0] == (70, 15360, 1)


def test_a_second_confirmation_moves_the_window_to_its_name() -> None:
    """A 1.31+ API server whose generated name was taken chooses another and validates
    again: the window must look for the pod under the name it was stored with, or a watch
    lagging past the window would release a live pod's slice."""
    ledger = ClaimLedger()
    placed = Reservation("r1", "n1", "team", "job-*", (GPUAllocation("GPU-0", 30, 0),), 0)
    ledger.hold(Claim(placed, 0, 0), (), 1.0)
    ledger.confirm("r1", "job-x7k2p", 2.0)
    ledger.confirm("r1", "job-q9d4z", 3.0)
    assert ledger.take_confirmed_since(2.5) == []  # the window restarted at 3.0
    ((rid, confirmed),) = ledger.take_confirmed_since(3.0)
    assert (rid, confirmed.pod, confirmed.namespace) == ("r1", "job-q9d4z", "team")
    ledger.confirm("r9", "other", 4.0)  # unknown: ignored
    assert ledger.take_confirmed_since(9.0) == []
