"""Ephemeral (debug) containers, added to a running pod through ``pods/ephemeralcontainers``.

They are never placed and get no GPU: mutation writes ``NVIDIA_VISIBLE_DEVICES=void`` into
every container the update adds (a CUDA image's own ``all`` would otherwise show every GPU of
the node), and validation refuses an added container with any other reserved variable. The
subresource's object is the Pod from Kubernetes 1.22; 1.20 and 1.21 send an
``EphemeralContainers`` object holding the list at its top level.
"""

from collections.abc import Mapping
from typing import Any, Final

from fracgpu import names
from webhook.admission import jsondiff, responses, validate
from webhook.admission.mutate import set_env
from webhook.admission.review import AdmissionRequest
from webhook.rules import pod as podlib

SUB_RESOURCE: Final = "ephemeralcontainers"
EPHEMERAL_KIND: Final = {"group": "", "version": "v1", "kind": "EphemeralContainers"}


def is_ephemeral_update(request: AdmissionRequest) -> bool:
    return (
        request.operation == "UPDATE"
        and request.sub_resource == SUB_RESOURCE
        and request.obj is not None
        and (request.is_pod or request.kind == EPHEMERAL_KIND)
    )


def mutate(request: AdmissionRequest) -> responses.Verdict:
    """``void`` on every ephemeral container the update adds; the patch is a diff."""
    assert request.obj is not None
    added, refused = _added_untampered(request)
    if refused is not None:
        return refused
    return responses.patched(_void_patch(request.obj, added))


def validate_update(request: AdmissionRequest) -> responses.Verdict:
    """An added ephemeral container carries fracgpu's ``void`` and no other reserved variable."""
    added, refused = _added_untampered(request)
    if refused is not None:
        return refused
    unmutated = [c["name"] for c in added if _reserved(c).get(names.ENV_VISIBLE_DEVICES) is None]
    if unmutated:
        return responses.denied(
            f"ephemeral container(s) {', '.join(unmutated)} lack NVIDIA_VISIBLE_DEVICES=void: "
            "the fracgpu mutating webhook did not see this update. Check that its "
            "MutatingWebhookConfiguration names pods/ephemeralcontainers, then try again"
        )
    return responses.allowed()


def _added_untampered(
    request: AdmissionRequest,
) -> tuple[list[dict[str, Any]], responses.Verdict | None]:
    """The ephemeral containers the update adds, and the denial when one sets a reserved
    variable (both webhooks refuse the same way)."""
    assert request.obj is not None
    added = _added(request.obj, request.old_obj)
    findings = _tampering(added)
    if findings:
        return added, responses.denied(validate.tamper_message(findings, "this debug container"))
    return added, None


def _void_patch(obj: Mapping[str, Any], added: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The patch writing ``void`` into the added containers: only their env is copied and
    diffed, never the whole pod (a pod of megabytes cost as much to copy and diff)."""
    holder = "" if obj.get("kind") == EPHEMERAL_KIND["kind"] else "/spec"
    ops: list[dict[str, Any]] = []
    wanted = {id(c) for c in added}
    for index, container in enumerate(_ephemeral(obj)):
        if id(container) not in wanted:
            continue
        env = {"env": container["env"]} if "env" in container else {}
        voided = {k: list(v) if isinstance(v, list) else v for k, v in env.items()}
        set_env(voided, names.ENV_VISIBLE_DEVICES, names.VISIBLE_DEVICES_NONE)
        ops += jsondiff.diff(env, voided, f"{holder}/{podlib.EPHEMERAL_CONTAINERS}/{index}")
    return ops


def _reserved(container: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return podlib.reserved_variables(container, f"ephemeral container {container['name']}")


def _tampering(added: list[dict[str, Any]]) -> list[str]:
    """Reserved variables a user set on added containers (fracgpu's own ``void`` aside)."""
    return [
        f'variable {name} in container "{container["name"]}"'
        for container in added
        for name, entry in sorted(_reserved(container).items())
        if dict(entry) != validate.VOID_ENTRY
    ]


def _added(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The ephemeral containers of ``obj`` that ``old`` does not have, by name."""
    before = {c["name"] for c in _ephemeral(old)} if old is not None else set()
    return [c for c in _ephemeral(obj) if c["name"] not in before]


def _ephemeral(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    holder = obj if obj.get("kind") == EPHEMERAL_KIND["kind"] else podlib.spec(obj)
    items = holder.get(podlib.EPHEMERAL_CONTAINERS) or []
    where = f".{podlib.EPHEMERAL_CONTAINERS}"
    if not isinstance(items, list):
        raise podlib.PodShapeError(where, f"must be a list, not {type(items).__name__}")
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise podlib.PodShapeError(f"{where}[{index}]", "must be an object with a name")
    return items


def added_containers(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The ephemeral containers an update adds (admission checks their privileges)."""
    return _added(obj, old)
