"""A pod that a later admission step refuses gives its reservation back within the admission
window, not after the reservation TTL (embedded mode, over HTTPS; cluster mode against a
real API server: tests/e2e/test_refused_release_e2e.py)."""

import jsonpatch
import yaml

from tests.webhook.conftest import StartWebhook
from tests.webhook.support import CLUSTER, Webhook, gpu_pod
from webhook.cli.client import build_review, patch_of
from webhook.state.clusterfile import parse_cluster
from webhook.state.embedded import EmbeddedState

WINDOW_S = 5.0
TTL_S = 300
WHOLE = {"tencent.com/vcuda-core": "100"}


async def started(start: StartWebhook, now: list[float]) -> Webhook:
    state = EmbeddedState(
        parse_cluster(yaml.safe_dump(CLUSTER)),
        10,
        TTL_S,
        clock=lambda: now[0],
        admission_window_s=WINDOW_S,
    )
    return await start(state)


async def mutated_only(hook: Webhook, name: str) -> dict:
    """What the API server holds after fracgpu's mutation when a later step refuses the pod:
    nothing, but fracgpu reserved a slice for the patched pod."""
    pod = gpu_pod(WHOLE, name=name, namespace="wholes")
    reply = await hook.client.review("/mutate", build_review(pod))
    assert reply.allowed, reply.message
    return jsonpatch.apply_patch(pod, patch_of(reply.body))


async def test_reservation_never_validated_is_given_back_after_the_window(
    start: StartWebhook,
) -> None:
    now = [1_000.0]
    hook = await started(start, now)
    refused = await mutated_only(hook, "refused")  # e.g. a later mutating webhook denied it
    # namespace "wholes" may hold one GPU: the refused pod's reservation holds it
    blocked = await hook.admit(gpu_pod(WHOLE, name="next", namespace="wholes"))
    assert not blocked.allowed
    assert "GPUQuota wholes/whole-gpus is exceeded" in blocked.message
    now[0] += WINDOW_S + 1  # far below the TTL
    admitted = await hook.admit(gpu_pod(WHOLE, name="next", namespace="wholes"))
    assert admitted.allowed, admitted.message
    # the refused pod arriving at validation after all is denied: no slice is handed out twice
    late = await hook.client.review("/validate", build_review(refused))
    assert not late.allowed
    assert "is not one fracgpu holds" in late.message


async def test_reservation_confirmed_by_validation_is_kept(start: StartWebhook) -> None:
    now = [1_000.0]
    hook = await started(start, now)
    first = await hook.admit(gpu_pod(WHOLE, name="first", namespace="wholes"))
    assert first.allowed, first.message
    now[0] += WINDOW_S * 10
    second = await hook.admit(gpu_pod(WHOLE, name="second", namespace="wholes"))
    assert not second.allowed  # the validated pod still holds the namespace's one GPU
    assert "GPUQuota wholes/whole-gpus is exceeded" in second.message
    assert hook.state.unconfirmed() == 0


async def test_dry_run_and_validation_within_the_window_release_nothing(
    start: StartWebhook,
) -> None:
    now = [1_000.0]
    hook = await started(start, now)
    pod = await mutated_only(hook, "slow")
    now[0] += WINDOW_S - 1  # slow mutating webhooks after fracgpu: still within the window
    dry = await hook.client.review("/validate", build_review(pod, dry_run=True))
    assert dry.allowed
    assert hook.state.unconfirmed() == 1  # a dry run confirms nothing
    reply = await hook.client.review("/validate", build_review(pod))
    assert reply.allowed, reply.message
    now[0] += WINDOW_S * 10
    blocked = await hook.admit(gpu_pod(WHOLE, name="next", namespace="wholes"))
    assert not blocked.allowed
