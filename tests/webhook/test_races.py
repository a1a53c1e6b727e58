"""Admission under contention: concurrent requests never over-commit a GPU, and a plan that
loses its reservation race is planned again (bounded), then denied with a clear message."""

import asyncio
from collections import defaultdict
from dataclasses import replace

from fracgpu.model import Quota, Reservation
from fracgpu.placement import ClusterView
from tests.webhook.conftest import StartWebhook
from tests.webhook.support import CLUSTER, cluster_state, gpu_pod
from webhook.state.backend import Claim
from webhook.state.embedded import EmbeddedState

CARD = {g["uuid"]: g["memoryMiB"] for n in CLUSTER["nodes"] for g in n["gpus"]}


async def test_concurrent_admissions_never_overcommit_a_gpu(start: StartWebhook) -> None:
    hook = await start()
    shapes = [
        {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "20"},
        {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "45", "nvidia.com/gpumem": "9000"},
        {"tencent.com/vcuda-core": "100"},
    ]
    pods = [gpu_pod(shapes[i % 3], name=f"p{i}") for i in range(40)]
    results = await asyncio.gather(*(hook.admit(p) for p in pods))
    admitted = [r for r in results if r.allowed]
    assert 3 <= len(admitted) < 40
    for denied in (r for r in results if not r.allowed):
        assert denied.message.startswith("no GPU has room for this pod now"), denied.message
    cores: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    for reservation in hook.state.reservations():
        for alloc in reservation.allocations:
            cores[alloc.uuid] += alloc.cores
            memory[alloc.uuid] += alloc.memory_mib
    assert len(hook.state.reservations()) == len(admitted)
    for uuid, used in cores.items():
        assert used <= 100
        assert memory[uuid] <= CARD[uuid]


class RacingState:
    """The embedded state, plus a competitor that grabs the planned GPUs just before the
    first ``races`` reservations land (what another webhook replica does)."""

    def __init__(self, inner: EmbeddedState, races: int) -> None:
        self.inner = inner
        self.races = races
        self.competitor_wins = 0

    def ready(self) -> bool:
        return self.inner.ready()

    async def view(self) -> ClusterView:
        return await self.inner.view()

    async def namespace_managed(self, namespace: str) -> bool:
        return await self.inner.namespace_managed(namespace)

    async def quotas(self, namespace: str) -> tuple[Quota, ...]:
        return await self.inner.quotas(namespace)

    async def reservation(self, reservation_id: str, node: str = "") -> Reservation | None:
        return await self.inner.reservation(reservation_id)

    def placing(self) -> bool:
        return self.inner.placing()

    async def check_placing(self) -> None:
        await self.inner.check_placing()

    async def reserve(self, claim: Claim) -> None:
        if self.competitor_wins < self.races:
            self.competitor_wins += 1
            rival = replace(claim.reservation, id=f"rival-{self.competitor_wins}")
            await self.inner.reserve(replace(claim, reservation=rival))
        await self.inner.reserve(claim)

    async def release(self, reservation_id: str) -> None:
        await self.inner.release(reservation_id)

    async def confirm(self, reservation_id: str, pod: str) -> None:
        await self.inner.confirm(reservation_id, pod)


WHOLE = {"tencent.com/vcuda-core": "100"}


async def test_a_lost_race_is_planned_again_on_other_gpus(start: StartWebhook) -> None:
    state = RacingState(cluster_state(), races=1)
    hook = await start(state, placement_attempts="3")
    result = await hook.admit(gpu_pod(WHOLE))
    assert result.allowed, result.message
    ours = await state.inner.reservation(
        result.pod["metadata"]["annotations"]["fracgpu.io/reservation-id"]
    )
    rival = await state.inner.reservation("rival-1")
    assert ours is not None and rival is not None
    assert ours.allocations[0].uuid != rival.allocations[0].uuid


async def test_losing_every_race_is_a_409_asking_to_retry(start: StartWebhook) -> None:
    state = RacingState(cluster_state(), races=10)
    hook = await start(state, placement_attempts="2")
    result = await hook.admit(gpu_pod(WHOLE))
    assert not result.allowed
    assert result.mutate.response["status"]["code"] == 409
    assert "the chosen GPUs were taken by other pods 2 times" in result.message
    assert state.competitor_wins == 2
    _, metrics = await hook.client.get("/metrics")
    assert 'fracgpu_webhook_placement_failures_total{reason="conflict"} 1.0' in metrics
