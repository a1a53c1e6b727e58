"""A denial names the pod's nodeSelector, required node affinity, tolerations and the taints
they miss only when a node they keep the pod off could have held it (docs/operations.md,
"Troubleshooting"): otherwise "add a toleration" or "widen the selector" would not help."""

import copy
from typing import Any

from tests.webhook.conftest import StartWebhook
from tests.webhook.support import CLUSTER, cluster_state, gpu_pod

NARROWED = "its nodeSelector, required node affinity and tolerations"
TOLERATION = {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}


def with_a100s_tainted() -> dict[str, Any]:
    """node-a (two 40 GiB A100s) tainted dedicated=training; node-t (a 15 GiB T4) not."""
    cluster = copy.deepcopy(CLUSTER)
    cluster["nodes"][0]["taints"] = [
        {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
    ]
    return cluster


def hami(memory_mib: int, cores: int = 10, model: str = "", name: str = "p") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory_mib)}
    limits["nvidia.com/gpucores"] = str(cores)
    return gpu_pod(
        limits, name=name, annotations={"nvidia.com/use-gputype": model} if model else None
    )


async def test_the_taint_of_the_only_node_that_could_hold_the_pod_is_named(
    start: StartWebhook,
) -> None:
    hook = await start(cluster_state(with_a100s_tainted()))
    denied = await hook.admit(hami(30000))  # only an A100 is large enough
    assert not denied.allowed
    assert denied.message.startswith("no GPU node in the cluster could ever hold this pod")
    assert denied.message.endswith(
        f"pool constraints; nodes it is kept off could hold it ({NARROWED} allow only node-t; "
        "not tolerated: node-a has taint dedicated=training:NoSchedule)"
    )
    tolerant = hami(30000, name="tolerant")
    tolerant["spec"]["tolerations"] = [TOLERATION]
    assert (await hook.admit(tolerant)).allowed  # the advice works


async def test_a_pod_that_fits_nowhere_gets_no_taint_note(start: StartWebhook) -> None:
    hook = await start(cluster_state(with_a100s_tainted()))
    denied = await hook.admit(hami(8 * 1024 * 1024))  # 8 TiB
    assert not denied.allowed
    assert denied.message.startswith("no GPU node in the cluster could ever hold this pod")
    assert "tolerat" not in denied.message and "taint" not in denied.message
    assert denied.message.endswith("check the GPU model, UUID and pool constraints")


async def test_a_pod_held_to_a_model_gets_no_note_on_nodes_of_other_models(
    start: StartWebhook,
) -> None:
    hook = await start(cluster_state(with_a100s_tainted()))
    never = await hook.admit(hami(20000, model="T4"))  # larger than the T4
    assert not never.allowed
    assert "could ever hold" in never.message and "taint" not in never.message
    filled = await hook.admit(hami(4096, cores=100, model="T4", name="whole-t4"))
    assert filled.allowed, filled.message
    not_now = await hook.admit(hami(1024, model="T4", name="late"))  # the A100s have room
    assert not not_now.allowed
    assert not_now.message.startswith("no GPU has room for this pod now")
    assert NARROWED not in not_now.message and "taint" not in not_now.message
    assert not_now.message.endswith("a bare pod must be created again")


async def test_a_node_outside_the_selector_that_has_room_now_is_named(
    start: StartWebhook,
) -> None:
    hook = await start()
    in_zone_b = {"topology.kubernetes.io/zone": "b"}  # node-t only
    filled = hami(4096, cores=100, name="whole-t4")
    filled["spec"]["nodeSelector"] = in_zone_b
    assert (await hook.admit(filled)).allowed
    late = hami(1024, name="late")
    late["spec"]["nodeSelector"] = in_zone_b
    denied = await hook.admit(late)
    assert not denied.allowed
    assert denied.message.endswith(
        f"a bare pod must be created again; nodes it is kept off have room for it ({NARROWED} "
        "allow only node-t; not matching its nodeSelector or node affinity: node-a)"
    )
