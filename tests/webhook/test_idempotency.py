"""Reinvocation places nothing again; dry-run reserves nothing."""

import copy

import jsonpatch

from fracgpu import names
from tests.webhook.support import WEBHOOK_SA, Webhook, gpu_pod
from webhook.cli.client import build_review, patch_of

SHARE = {"tencent.com/vcuda-core": "25", "tencent.com/vcuda-memory": "8"}


async def test_reinvocation_returns_no_patch_and_reserves_nothing_more(webhook: Webhook) -> None:
    first = await webhook.admit(gpu_pod(SHARE))
    assert first.allowed
    held = webhook.state.reservations()
    assert len(held) == 1
    view_before = await webhook.state.view()
    free_before = {
        (n.name, d.uuid): view_before.gpu_free(n.name, d.uuid)
        for n in view_before.nodes()
        for d in n.devices
    }
    again = await webhook.client.review("/mutate", build_review(first.pod))
    assert again.allowed
    assert "patch" not in again.response
    assert webhook.state.reservations() == held
    view = await webhook.state.view()
    assert {
        (n.name, d.uuid): view.gpu_free(n.name, d.uuid) for n in view.nodes() for d in n.devices
    } == free_before


async def test_reinvocation_after_another_webhook_added_a_sidecar_only_voids_it(
    webhook: Webhook,
) -> None:
    first = await webhook.admit(gpu_pod(SHARE))
    with_sidecar = copy.deepcopy(first.pod)
    with_sidecar["spec"]["containers"].append({"name": "mesh-proxy", "image": "envoy"})
    again = await webhook.client.review("/mutate", build_review(with_sidecar))
    assert again.allowed
    assert patch_of(again.body) == [
        {
            "op": "add",
            "path": "/spec/containers/1/env",
            "value": [{"name": names.ENV_VISIBLE_DEVICES, "value": "void"}],
        }
    ]
    assert len(webhook.state.reservations()) == 1
    final = jsonpatch.apply_patch(with_sidecar, patch_of(again.body))
    assert (await webhook.client.review("/validate", build_review(final))).allowed


async def test_reinvocation_of_a_pod_without_gpus_is_stable(webhook: Webhook) -> None:
    pod = {
        "metadata": {"name": "w", "namespace": "team"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    first = await webhook.client.review("/mutate", build_review(pod))
    patched = jsonpatch.apply_patch(pod, patch_of(first.body))
    again = await webhook.client.review("/mutate", build_review(patched))
    assert again.allowed and "patch" not in again.response


async def test_dry_run_returns_the_patch_but_reserves_nothing(webhook: Webhook) -> None:
    quotas_before = await webhook.state.quotas("limited")
    pod = gpu_pod(SHARE, namespace="limited")
    dry = await webhook.admit(pod, dry_run=True)
    assert dry.allowed, dry.message
    assert names.ANNOTATION_ASSIGNMENT in dry.pod["metadata"]["annotations"]
    assert webhook.state.reservations() == ()
    assert await webhook.state.quotas("limited") == quotas_before
    # the same pod for real is still admitted, and only then reserved and charged
    real = await webhook.admit(pod)
    assert real.allowed
    assert len(webhook.state.reservations()) == 1
    (quota,) = await webhook.state.quotas("limited")
    assert (quota.used.cores, quota.used.memory_mib) == (25, 2048)


async def test_dry_runs_never_fill_the_cluster(webhook: Webhook) -> None:
    for i in range(20):
        dry = await webhook.admit(
            gpu_pod({"tencent.com/vcuda-core": "100"}, name=f"p{i}"), dry_run=True
        )
        assert dry.allowed, dry.message
    assert webhook.state.reservations() == ()


async def test_a_forged_assignment_is_not_reapplied(webhook: Webhook) -> None:
    first = await webhook.admit(gpu_pod(SHARE))
    forged = copy.deepcopy(first.pod)
    annotation = forged["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT]
    forged["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT] = annotation.replace(
        '"cores":25', '"cores":100'
    )
    reply = await webhook.client.review("/mutate", build_review(forged))
    assert not reply.allowed
    assert "the assignment differs from reservation" in reply.message
    trusted = await webhook.client.review("/mutate", build_review(forged, username=WEBHOOK_SA))
    assert trusted.allowed


async def test_real_arrivals_teach_the_workload_and_dry_runs_do_not(webhook: Webhook) -> None:
    view = await webhook.state.view()
    before = view.observations
    for i in range(2):
        assert (await webhook.admit(gpu_pod(SHARE, name=f"learn-{i}"))).allowed
    assert (await webhook.admit(gpu_pod(SHARE, name="dry"), dry_run=True)).allowed
    never = await webhook.admit(gpu_pod({"tencent.com/vcuda-core": "6400"}, name="huge"))
    assert not never.allowed  # refused arrivals count too: they are part of the workload
    assert (await webhook.state.view()).observations - before == 3
