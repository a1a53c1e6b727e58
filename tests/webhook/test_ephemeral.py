"""Debug containers added through pods/ephemeralcontainers, over HTTPS: both object shapes
(1.22+ sends the Pod, 1.20-1.21 an EphemeralContainers object)."""

import copy
from typing import Any

import jsonpatch
import pytest

from fracgpu import names
from tests.webhook.support import WEBHOOK_SA, Webhook, plain_pod
from webhook.cli.client import build_review, patch_of

VOID = {"name": names.ENV_VISIBLE_DEVICES, "value": names.VISIBLE_DEVICES_NONE}


def _as_pod(debug: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    old = plain_pod()
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = debug
    return old, new


def _as_ephemeral_object(debug: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    meta = {"name": "web", "namespace": "team"}
    old = {"apiVersion": "v1", "kind": "EphemeralContainers", "metadata": meta}
    return old, {**old, "ephemeralContainers": debug}


def _review(old: dict[str, Any], new: dict[str, Any], username: str = "alice") -> dict[str, Any]:
    review = build_review(
        new, "UPDATE", old=old, sub_resource="ephemeralcontainers", username=username
    )
    if new.get("kind") == "EphemeralContainers":
        review["request"]["kind"] = {"group": "", "version": "v1", "kind": "EphemeralContainers"}
    return review


def _debug_list(obj: dict[str, Any]) -> list[dict[str, Any]]:
    holder = obj if obj.get("kind") == "EphemeralContainers" else obj["spec"]
    found: list[dict[str, Any]] = holder["ephemeralContainers"]
    return found


SHAPES = pytest.mark.parametrize("shape", [_as_pod, _as_ephemeral_object], ids=["pod", "object"])


@SHAPES
async def test_an_added_debug_container_gets_void_and_then_passes_validation(
    webhook: Webhook, shape: Any
) -> None:
    old, new = shape([{"name": "debugger", "image": "cuda", "env": [{"name": "A", "value": "1"}]}])
    mutated = await webhook.client.review("/mutate", _review(old, new))
    assert mutated.allowed
    patched = jsonpatch.apply_patch(new, patch_of(mutated.body))
    assert _debug_list(patched)[0]["env"] == [{"name": "A", "value": "1"}, VOID]
    validated = await webhook.client.review("/validate", _review(old, patched))
    assert validated.allowed, validated.message


@SHAPES
async def test_debug_containers_already_there_are_left_alone(webhook: Webhook, shape: Any) -> None:
    earlier = {"name": "first", "image": "busybox", "env": [VOID]}
    _, old = shape([earlier])  # the object as it is: one debug container already
    new = copy.deepcopy(old)
    _debug_list(new).append({"name": "second", "image": "busybox"})
    mutated = await webhook.client.review("/mutate", _review(old, new))
    ops = patch_of(mutated.body)
    assert ops and all("/1/" in op["path"] or op["path"].endswith("/1") for op in ops), ops


@SHAPES
@pytest.mark.parametrize(
    "variable",
    [
        {"name": names.ENV_VISIBLE_DEVICES, "value": "all"},
        {"name": names.ENV_VISIBLE_DEVICES, "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
        {"name": "FRACGPU_LIMITS_FILE", "value": "/tmp/mine"},
    ],
    ids=["all", "value-from", "fracgpu-variable"],
)
async def test_an_added_debug_container_cannot_set_reserved_variables(
    webhook: Webhook, shape: Any, variable: dict[str, Any]
) -> None:
    old, new = shape([{"name": "debugger", "image": "cuda", "env": [variable]}])
    for endpoint in ("/mutate", "/validate"):
        reply = await webhook.client.review(endpoint, _review(old, new))
        assert not reply.allowed
        assert f'variable {variable["name"]} in container "debugger"' in reply.message
        assert "only fracgpu may set" in reply.message


@SHAPES
async def test_validation_refuses_a_debug_container_mutation_never_saw(
    webhook: Webhook, shape: Any
) -> None:
    old, new = shape([{"name": "debugger", "image": "cuda"}])
    reply = await webhook.client.review("/validate", _review(old, new))
    assert not reply.allowed
    assert "debugger lack NVIDIA_VISIBLE_DEVICES=void" in reply.message


async def test_fracgpus_own_accounts_pass_validation(webhook: Webhook) -> None:
    old, new = _as_pod([{"name": "debugger", "image": "cuda"}])
    reply = await webhook.client.review("/validate", _review(old, new, WEBHOOK_SA))
    assert reply.allowed


async def test_a_malformed_list_is_refused_with_a_message(webhook: Webhook) -> None:
    old, new = _as_pod([{"image": "no-name"}])
    reply = await webhook.client.review("/mutate", _review(old, new))
    assert not reply.allowed
    assert ".ephemeralContainers[0]: must be an object with a name" in reply.message
