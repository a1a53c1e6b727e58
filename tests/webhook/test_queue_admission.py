"""Queue mode at admission (issue 21), through /mutate then /validate of a real HTTPS webhook:
a pod that fits now is placed as today, one that fits the cluster but not now is created
queued (quota charged), one that can never fit or is over quota is still refused. Plus the
attacks queue mode invites: naming fracgpu's scheduler, forging or editing the queued entry,
and using the queue to hold more than the quota allows."""

import asyncio
import copy
from typing import Any, Final

import orjson
import pytest

from fracgpu import names
from tests.webhook.conftest import StartWebhook
from tests.webhook.support import WEBHOOK_SA, Webhook, cluster_state, gpu_pod, plain_pod
from webhook.cli.client import build_review
from webhook.queue import entry as queued

WHOLE: Final = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}
SHARE: Final = {"tencent.com/vcuda-core": "60", "tencent.com/vcuda-memory": "16"}


@pytest.fixture
async def queue(start: StartWebhook) -> Webhook:
    return await start(cluster_state(), placement_mode="queue")


async def fill(hook: Webhook, namespace: str = "team") -> None:
    """Every GPU of the test cluster (2 x A100, 1 x T4) taken by a whole-GPU pod."""
    for i in range(3):
        placed = await hook.admit(gpu_pod(WHOLE, name=f"fill-{i}", namespace=namespace))
        assert placed.allowed, placed.message
        assert names.ANNOTATION_ASSIGNMENT in placed.pod["metadata"]["annotations"]


def annotations(pod: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = pod["metadata"].get("annotations", {})
    return found


async def test_a_pod_that_fits_now_is_placed_at_admission_as_in_immediate_mode(
    queue: Webhook,
) -> None:
    result = await queue.admit(gpu_pod(SHARE))
    assert result.allowed, result.message
    assert names.ANNOTATION_ASSIGNMENT in annotations(result.pod)
    assert names.ANNOTATION_QUEUED not in annotations(result.pod)
    assert "schedulerName" not in result.pod["spec"]


async def test_a_pod_that_does_not_fit_now_is_created_queued_with_the_contract(
    queue: Webhook,
) -> None:
    await fill(queue)
    result = await queue.admit(gpu_pod(SHARE, name="waits"))
    assert result.allowed, result.message
    pod = result.pod
    written = annotations(pod)
    assert names.ANNOTATION_ASSIGNMENT not in written
    assert names.ANNOTATION_RESERVATION_ID in written
    entry = queued.decode(written[names.ANNOTATION_QUEUED])
    assert [(r.container, r.gpus, r.cores) for r in entry.requests] == [("main", 1, 60)]
    assert pod["spec"]["schedulerName"] == names.DEFAULT_SCHEDULER_NAME
    assert "affinity" not in pod["spec"]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {
        "tencent.com/vcuda-core": "60",
        "tencent.com/vcuda-memory": "16",
    }
    assert all(e["name"] != names.ENV_VISIBLE_DEVICES for e in container.get("env", []))
    # Its region volume, as a placed pod's: the agent reads the region there when it starts.
    region = names.region_volume_name("main")
    assert container["volumeMounts"] == [{"name": region, "mountPath": "/var/run/fracgpu"}]
    assert pod["spec"]["volumes"] == [
        {"name": region, "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}
    ]
    assert any(
        w.startswith("queued: no GPU has room") for w in result.mutate.response.get("warnings", [])
    )


async def test_non_gpu_containers_of_a_queued_pod_still_see_no_gpu(queue: Webhook) -> None:
    await fill(queue)
    sidecar = {"name": "log", "image": "busybox"}
    result = await queue.admit(gpu_pod(SHARE, name="waits", extra_containers=[sidecar]))
    assert result.allowed, result.message
    env = result.pod["spec"]["containers"][1]["env"]
    assert {"name": names.ENV_VISIBLE_DEVICES, "value": names.VISIBLE_DEVICES_NONE} in env


async def test_never_fits_and_immediate_mode_are_refused_as_before(
    queue: Webhook, start: StartWebhook
) -> None:
    huge = gpu_pod({"nvidia.com/gpu": "4", "nvidia.com/gpucores": "100"}, name="huge")
    result = await queue.admit(huge)
    assert not result.allowed
    assert "could ever hold this pod" in result.message
    immediate = await start(cluster_state())
    await fill(immediate)
    refused = await immediate.admit(gpu_pod(SHARE, name="waits"))
    assert not refused.allowed
    assert "no GPU has room for this pod now" in refused.message


async def test_queued_pods_hold_their_quota_charge(queue: Webhook) -> None:
    """Namespace "wholes" may hold 1 whole GPU: one queued whole-GPU pod takes it, so a
    second is refused at admission with the quota message, not queued."""
    await fill(queue)
    first = await queue.admit(gpu_pod(WHOLE, name="w1", namespace="wholes"))
    assert first.allowed, first.message
    assert names.ANNOTATION_QUEUED in annotations(first.pod)
    (quota,) = await queue.state.quotas("wholes")
    assert quota.used.gpus == 1
    second = await queue.admit(gpu_pod(WHOLE, name="w2", namespace="wholes"))
    assert not second.allowed
    assert "GPUQuota wholes/whole-gpus is exceeded" in second.message


async def test_dry_run_queues_nothing(queue: Webhook) -> None:
    await fill(queue)
    shown = await queue.admit(gpu_pod(WHOLE, name="w1", namespace="wholes"), dry_run=True)
    assert shown.allowed
    (quota,) = await queue.state.quotas("wholes")
    assert quota.used.gpus == 0


async def test_reinvocation_writes_the_same_queued_pod_again(queue: Webhook) -> None:
    await fill(queue)
    result = await queue.admit(gpu_pod(SHARE, name="waits"))
    again = await queue.client.review("/mutate", build_review(result.pod))
    assert again.allowed, again.message
    assert not again.response.get("patch")


# -- attacks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("pod", [gpu_pod(SHARE), plain_pod()], ids=["gpu", "no-gpu"])
async def test_a_tenant_cannot_name_fracgpus_scheduler(queue: Webhook, pod: dict[str, Any]) -> None:
    pod = copy.deepcopy(pod)
    pod["spec"]["schedulerName"] = names.DEFAULT_SCHEDULER_NAME
    for endpoint in ("/mutate", "/validate"):
        reply = await queue.client.review(endpoint, build_review(pod))
        assert not reply.allowed, endpoint
        assert "fracgpu's own scheduler" in reply.message
    changed = await queue.client.review("/validate", build_review(pod, "UPDATE", old=plain_pod()))
    assert not changed.allowed
    trusted = await queue.client.review("/mutate", build_review(pod, username=WEBHOOK_SA))
    assert trusted.allowed


async def test_a_tenant_cannot_write_the_queued_annotation(start: StartWebhook) -> None:
    hook = await start(cluster_state(), placement_mode="queue", admission_window_seconds="0.5")
    await fill(hook)
    genuine = (await hook.admit(gpu_pod(SHARE, name="waits"))).pod
    made_up = gpu_pod(SHARE, name="own", annotations={names.ANNOTATION_QUEUED: "{}"})
    reply = await hook.client.review("/mutate", build_review(made_up))
    assert not reply.allowed
    assert names.ANNOTATION_QUEUED in reply.message
    await asyncio.sleep(0.6)
    # A genuine entry copied onto a pod of the tenant's own, later: refused by both webhooks.
    copied = copy.deepcopy(genuine)
    copied["metadata"]["name"] = "copy"
    for endpoint in ("/mutate", "/validate"):
        reply = await hook.client.review(endpoint, build_review(copied))
        assert not reply.allowed, endpoint
        assert "seal" in reply.message


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda e: {**e, "highPriority": True}, id="jump-the-queue"),
        pytest.param(lambda e: {**e, "queuedAtMs": 0}, id="claim-to-be-first"),
        pytest.param(
            lambda e: {**e, "containers": [{**e["containers"][0], "chargedMiB": 256}]},
            id="charge-less",
        ),
    ],
)
async def test_validation_refuses_a_queued_entry_fracgpu_did_not_seal(
    queue: Webhook, change: Any
) -> None:
    await fill(queue)
    pod = (await queue.admit(gpu_pod(SHARE, name="waits"))).pod
    ok = await queue.client.review("/validate", build_review(pod))
    assert ok.allowed, ok.message
    raw = orjson.loads(annotations(pod)[names.ANNOTATION_QUEUED])
    pod["metadata"]["annotations"][names.ANNOTATION_QUEUED] = orjson.dumps(change(raw)).decode()
    reply = await queue.client.review("/validate", build_review(pod))
    assert not reply.allowed
    assert "seal" in reply.message


async def test_validation_refuses_a_queued_pod_whose_resources_were_changed(
    queue: Webhook,
) -> None:
    await fill(queue)
    pod = (await queue.admit(gpu_pod(SHARE, name="waits"))).pod
    for section in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"][section]["tencent.com/vcuda-core"] = "10"
    reply = await queue.client.review("/validate", build_review(pod))
    assert not reply.allowed
    assert "differs from what fracgpu wrote" in reply.message


async def test_a_tenant_cannot_add_or_change_the_queued_annotation_on_update(
    queue: Webhook,
) -> None:
    await fill(queue)
    pod = (await queue.admit(gpu_pod(SHARE, name="waits"))).pod
    edited = copy.deepcopy(pod)
    edited["metadata"]["annotations"][names.ANNOTATION_QUEUED] = "{}"
    reply = await queue.client.review("/validate", build_review(edited, "UPDATE", old=pod))
    assert not reply.allowed
    added = copy.deepcopy(pod)
    bare = copy.deepcopy(pod)
    del bare["metadata"]["annotations"][names.ANNOTATION_QUEUED]
    reply = await queue.client.review("/validate", build_review(added, "UPDATE", old=bare))
    assert not reply.allowed
    assert names.ANNOTATION_QUEUED in reply.message
