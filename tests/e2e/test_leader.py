"""Leader election on a real Lease: who places, when a successor may start, and handover.

The candidates share one settable clock, so lease expiry and the takeover grace are exact.
"""

import time
import uuid
from pathlib import Path

import kubernetes.client

from webhook.cluster.apiclient import KubeApi, endpoint_from_kubeconfig
from webhook.cluster.leader import LEADER_URL_ANNOTATION, LeaderElector, LeaseSettings

from .harness import ControlPlane
from .webhook_harness import WebhookReplica, WebhookTLS

GRACE_S = 30.0
HANDOVER_S = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def candidate(api: KubeApi, namespace: str, lease: str, name: str, clock: Clock) -> LeaderElector:
    settings = LeaseSettings(
        namespace,
        lease,
        name,
        lease_duration_s=15,
        renew_deadline_s=10,
        takeover_grace_s=GRACE_S,
        handover_wait_s=HANDOVER_S,
        advertise_url=f"https://{name}.example:8443",
    )
    return LeaderElector(api, settings, clock=clock)


async def test_only_a_fresh_leader_places_and_a_crashed_ones_successor_waits(
    kubeconfig: Path, namespace: str
) -> None:
    lease, clock = f"lease-{uuid.uuid4().hex[:6]}", Clock()
    async with KubeApi(endpoint_from_kubeconfig(str(kubeconfig))) as api:
        a = candidate(api, namespace, lease, "a", clock)
        b = candidate(api, namespace, lease, "b", clock)
        # The first holder ever has no predecessor to wait for.
        assert await a.try_acquire_or_renew()
        assert a.leadership.placing()
        lease_obj = await api.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}"
        )
        assert (
            lease_obj["metadata"]["annotations"][LEADER_URL_ANNOTATION] == "https://a.example:8443"
        )
        assert not await b.try_acquire_or_renew()
        assert not b.leadership.placing()
        assert b.leadership.leader_url == "https://a.example:8443"
        # A leader that has not renewed for the renew deadline stops placing, before the
        # lease expires for anyone else.
        clock.advance(11)
        assert not a.leadership.placing()
        assert "could not renew" in a.leadership.why_not_placing()
        assert not await b.try_acquire_or_renew()  # 11 s < 15 s: still a's
        assert await a.try_acquire_or_renew()
        assert a.leadership.placing()
        # A renewal that failed (the API server blinked) costs no wait when nobody wrote the
        # Lease since: this process still holds everything it admitted.
        a._lost()  # what a failed renewal does
        assert not a.leadership.placing()
        assert await a.try_acquire_or_renew() and a.leadership.placing()

        # a dies without handing over: b takes the Lease only after it expires, then waits.
        clock.advance(14)
        assert not await b.try_acquire_or_renew()
        clock.advance(2)
        assert await b.try_acquire_or_renew()
        assert b.is_leader and not b.leadership.placing()
        assert "places pods in 30 s" in b.leadership.why_not_placing()
        clock.advance(GRACE_S - 1)
        assert await b.try_acquire_or_renew() and not b.leadership.placing()
        clock.advance(1)
        assert await b.try_acquire_or_renew() and b.leadership.placing()

        # b restarts under the same name: the new process did not write what the old one held.
        reborn = candidate(api, namespace, lease, "b", clock)
        assert await reborn.try_acquire_or_renew()
        assert not reborn.leadership.placing()

        # A clean handover: the next holder waits only for the newest pods to reach its cache.
        clock.advance(GRACE_S)
        assert await reborn.try_acquire_or_renew() and reborn.leadership.placing()
        assert await reborn.release()
        assert not reborn.leadership.placing()
        follower = candidate(api, namespace, lease, "c", clock)
        assert await follower.refresh_leader() == ""  # nobody holds it now
        assert await a.try_acquire_or_renew()
        assert not a.leadership.placing()
        clock.advance(HANDOVER_S)
        assert await a.try_acquire_or_renew()
        assert a.leadership.placing()
        assert await follower.refresh_leader() == "https://a.example:8443"
        # A release by a replica that no longer holds the Lease changes nothing.
        assert not await reborn.release()
        assert await a.try_acquire_or_renew() and a.leadership.placing()


def test_a_new_leaders_first_lease_write_already_names_its_url(
    control_plane: ControlPlane,
    kube_client: kubernetes.client.ApiClient,
    fracgpu_crds: list[str],
    namespace: str,
    tmp_path: Path,
) -> None:
    """Followers read the leader's URL from the Lease: a Lease held without it (the election
    started before the server knew its address) refused GPU pods for up to one renewal."""
    lease = f"lease-{uuid.uuid4().hex[:6]}"
    tls = WebhookTLS.create(tmp_path / "tls")
    extra = ["--lease-namespace", namespace, "--lease-name", lease]
    replica = WebhookReplica("url-first", control_plane.kubeconfig("admin"), tls, tmp_path, extra)
    coordination = kubernetes.client.CoordinationV1Api(kube_client)
    replica.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                found = coordination.read_namespaced_lease(lease, namespace)
            except kubernetes.client.ApiException:
                found = None
            if found is not None and found.spec.holder_identity:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the replica never took the Lease: {replica.log_tail()}")
        annotations = found.metadata.annotations or {}
        assert annotations.get(LEADER_URL_ANNOTATION) == f"https://127.0.0.1:{replica.port}"
    finally:
        replica.stop()
