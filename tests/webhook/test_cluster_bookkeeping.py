"""The cluster back end's per-pod bookkeeping stays bounded by one reservation TTL."""

from typing import Any

from fracgpu import names
from webhook.cluster.apiclient import Endpoint, KubeApi
from webhook.cluster.state import KubeState, KubeStateSettings

TTL = 60


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
        KubeStateSettings(reservation_ttl_s=TTL),
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
