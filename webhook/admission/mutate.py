"""Write fracgpu's decision into a copy of the pod, and diff it into a JSONPatch.

``decide`` is a fixed point: applied to a pod it already wrote, it changes nothing. The
validating webhook relies on that to check that a pod carries exactly what fracgpu wrote.
Patches are always a diff of before vs after (``webhook.admission.jsondiff``), never hand-written
ops. Only the parts ``decide`` writes (metadata annotations and labels, spec.affinity and
tolerations and volumes, containers' env, resources and volume mounts) are copied, written
and compared: the rest of a pod is shared unchanged, and copying and diffing it was most of
the cost of an admission.

Every GPU container gets its region volume (``fracgpu.region_volume``): a memory-backed
emptyDir of its pod's own at ``names.CONTAINER_REGION_DIR``, where its shim keeps the
accounting region (a directory the container writes, so its pod's memory, not host disk).
"""

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from fracgpu import names, region_volume
from fracgpu.codec import encode_assignment
from fracgpu.dialects import DialectConfig, canonical_quantities
from fracgpu.model import Assignment, ContainerAssignment
from webhook.admission import jsondiff
from webhook.rules import pod as podlib

# matchFields on metadata.name pins to the Node object itself (the hostname label can differ).
NODE_NAME_FIELD: Final = "metadata.name"
_SPEC_WRITTEN: Final = (
    "affinity",
    "schedulerName",
    "tolerations",
    "volumes",
    *podlib.PLACED_FIELDS,
)
_CONTAINER_WRITTEN: Final = ("name", "env", "resources", "volumeMounts")
_LABEL_VALUE: Final = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
# The toleration of the GPU nodes' taint that GPU pods get (``tolerations.gpu_node_toleration``),
# or None when GPU nodes carry none (setting gpu-node-taint).
Toleration = Mapping[str, str] | None


def decide(
    pod: Mapping[str, Any],
    assignment: Assignment | None,
    config: DialectConfig,
    *,
    toleration: Toleration = None,
) -> dict[str, Any]:
    """A new pod: ``assignment`` written in, or (None) only ``void`` on every container; a GPU
    pod (``assignment`` given) also gets ``toleration``, and each GPU container its region
    volume. What ``decide`` does not write is shared with ``pod``: callers only read the
    result."""
    written = _write_decision(_json_copy(_written_parts(pod)), assignment, config, toleration)
    return _merged(pod, written)


def patch_for(
    pod: Mapping[str, Any],
    assignment: Assignment | None,
    config: DialectConfig,
    *,
    toleration: Toleration = None,
) -> list[dict[str, Any]]:
    """The JSONPatch that turns ``pod`` into ``decide(pod, assignment, config, toleration=...)``:
    the diff of the parts ``decide`` writes, before and after, without building the whole
    new pod."""
    before = _written_parts(pod)
    after = _write_decision(_json_copy(before), assignment, config, toleration)
    return jsondiff.diff(before, after)


def queued_patch_for(
    pod: Mapping[str, Any],
    held: Sequence[ContainerAssignment],
    annotations: Mapping[str, str],
    scheduler_name: str,
    config: DialectConfig,
    *,
    toleration: Toleration = None,
) -> list[dict[str, Any]]:
    """The JSONPatch that queues ``pod`` (queue mode): fracgpu's ``annotations`` (the queued
    entry, the reservation ID), the fracgpu scheduler, and canonical resources for the GPUs
    charged (``held``: GPUs on no particular card) so kubelet's device manager allocates the
    agent's resources. No assignment, node pin or ``NVIDIA_VISIBLE_DEVICES`` on GPU
    containers: they are chosen at bind, and the agent hands the devices over at Allocate.
    ``toleration``: as ``decide`` writes it, so that the pod may be bound to a GPU node; each
    charged container's region volume likewise."""
    before = _written_parts(pod)
    after = _json_copy(before)
    meta_annotations = _child(_child(after, "metadata"), "annotations")
    meta_annotations.update(annotations)
    _child(after, "spec")["schedulerName"] = scheduler_name
    _write_toleration(after, toleration)
    by_name = {c.container: c for c in held}
    for field, index, _ in list(podlib.containers(after)):
        container = _child_list(_child(after, "spec"), field)[index]
        charged = by_name.get(container["name"])
        if charged is None:
            set_env(container, names.ENV_VISIBLE_DEVICES, names.VISIBLE_DEVICES_NONE)
        else:
            _write_resources(container, charged, config)
            _write_region_volume(after, container)
    return jsondiff.diff(before, after)


def make_patch(original: Mapping[str, Any], mutated: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch from ``original`` to ``mutated``, where they can differ: the parts
    ``decide`` writes (``_written_parts``)."""
    return jsondiff.diff(_written_parts(original), _written_parts(mutated))


def _write_decision(
    parts: dict[str, Any],
    assignment: Assignment | None,
    config: DialectConfig,
    toleration: Toleration,
) -> dict[str, Any]:
    """Write the decision into ``parts`` (a copy of a pod's written parts); returns them."""
    if assignment is not None:
        _write_metadata(parts, assignment)
        _pin_to_node(parts, assignment.node)
        _write_toleration(parts, toleration)
    for field, index, _ in list(podlib.containers(parts)):
        container = _child_list(_child(parts, "spec"), field)[index]
        held = assignment.for_container(container["name"]) if assignment else None
        if held is None:
            set_env(container, names.ENV_VISIBLE_DEVICES, names.VISIBLE_DEVICES_NONE)
        else:
            _write_resources(container, held, config)
            set_env(container, names.ENV_VISIBLE_DEVICES, ",".join(d.uuid for d in held.devices))
            _write_region_volume(parts, container)
    return parts


def _write_region_volume(parts: dict[str, Any], container: dict[str, Any]) -> None:
    """The container's region volume and its mount, each replacing any of that name (so
    ``decide`` stays a fixed point and a tenant's volume of the name becomes fracgpu's)."""
    name = container["name"]
    _put_named(_child_list(_child(parts, "spec"), "volumes"), region_volume.volume(name))
    _put_named(_child_list(container, "volumeMounts"), region_volume.mount(name))


def _put_named(items: list[Any], entry: dict[str, Any]) -> None:
    """Put ``entry`` in place of the first item of its name (dropping any other), or last."""
    matches = [
        i
        for i, item in enumerate(items)
        if isinstance(item, dict) and item.get("name") == entry["name"]
    ]
    if not matches:
        items.append(entry)
        return
    items[matches[0]] = entry
    for i in reversed(matches[1:]):
        del items[i]


def _write_toleration(parts: dict[str, Any], toleration: Toleration) -> None:
    """Append ``toleration`` unless the pod has it already (so ``decide`` stays a fixed point)."""
    if toleration is None:
        return
    tolerations = _child_list(_child(parts, "spec"), "tolerations")
    if dict(toleration) not in tolerations:
        tolerations.append(dict(toleration))


def _written_parts(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The members ``decide`` may write, at their paths in the pod (not copied). Containers
    keep their names: the diff pairs them by position, and a name change would show."""
    parts: dict[str, Any] = {}
    for key, members in (("metadata", ("annotations", "labels")), ("spec", _SPEC_WRITTEN)):
        if key in pod:
            value = pod[key]
            parts[key] = (
                {k: value[k] for k in members if k in value} if isinstance(value, dict) else value
            )
    spec = parts.get("spec")
    if isinstance(spec, dict):
        for field in podlib.PLACED_FIELDS:
            if isinstance(spec.get(field), list):
                spec[field] = [
                    {k: c[k] for k in _CONTAINER_WRITTEN if k in c} if isinstance(c, dict) else c
                    for c in spec[field]
                ]
    return parts


def _merged(pod: Mapping[str, Any], written: Mapping[str, Any]) -> dict[str, Any]:
    """``pod`` with the decided parts in place of its own (the rest shared, not copied)."""
    merged = dict(pod)
    metadata = written.get("metadata")
    if isinstance(metadata, dict):
        merged["metadata"] = {**_members(pod.get("metadata")), **metadata}
    spec = written.get("spec")
    if isinstance(spec, dict):
        original = _members(pod.get("spec"))
        spec = merged["spec"] = {**original, **spec}
        for field in podlib.PLACED_FIELDS:
            items = original.get(field)
            if isinstance(items, list):  # containers() checked that each item is an object
                spec[field] = [
                    {**item, **decided} for item, decided in zip(items, spec[field], strict=True)
                ]
    return merged


def _members(value: Any) -> Mapping[str, Any]:
    """An object's members; ``{}`` for the absent or null value ``decide`` replaced."""
    return value if isinstance(value, dict) else {}


def _json_copy(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars), several times faster than deepcopy."""
    if isinstance(value, dict):
        return {k: _json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_copy(v) for v in value]
    return value


def is_label_value(text: str) -> bool:
    return len(text) <= 63 and _LABEL_VALUE.fullmatch(text) is not None


def bind_metadata(assignment: Assignment) -> dict[str, Any]:
    """The metadata a queued pod gets when the extender binds it (a merge patch): the same
    assignment annotation, reservation ID and labels immediate mode writes at admission."""
    parts: dict[str, Any] = {}
    _write_metadata(parts, assignment)
    metadata: dict[str, Any] = parts["metadata"]
    return metadata


def _write_metadata(pod: dict[str, Any], assignment: Assignment) -> None:
    meta = _child(pod, "metadata")
    annotations = _child(meta, "annotations")
    annotations[names.ANNOTATION_ASSIGNMENT] = encode_assignment(assignment)
    annotations[names.ANNOTATION_RESERVATION_ID] = assignment.reservation_id
    labels = _child(meta, "labels")
    labels[names.LABEL_MANAGED] = "true"
    # Node names may be 253 characters; a label value only 63. The annotation has it anyway.
    if is_label_value(assignment.node):
        labels[names.LABEL_ASSIGNED_NODE] = assignment.node


def _pin_to_node(pod: dict[str, Any], node: str) -> None:
    """AND ``metadata.name In [node]`` into every required term (terms are ORed)."""
    required = _child(
        _child(_child(_child(pod, "spec"), "affinity"), "nodeAffinity"),
        "requiredDuringSchedulingIgnoredDuringExecution",
    )
    pin = {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}
    terms = _child_list(required, "nodeSelectorTerms")
    if not terms:
        terms.append({})
    for index in range(len(terms)):
        if not isinstance(terms[index], dict):
            raise podlib.PodShapeError(
                f".spec.affinity.nodeAffinity.required...nodeSelectorTerms[{index}]",
                "must be an object",
            )
        fields = _child_list(terms[index], "matchFields")
        if pin not in fields:
            fields.append(pin)


def _write_resources(
    container: dict[str, Any], held: ContainerAssignment, config: DialectConfig
) -> None:
    """Replace dialect resources by the canonical ones, in limits and requests alike."""
    rn = config.names
    values = canonical_resources(held, config)
    # No node advertises vcuda-core-limit or the HAMi priority: left in place they would keep
    # the pod Pending. The assignment carries both; the agent applies them.
    replaced = rn.everything()
    resources = _child(container, "resources")
    for section in ("limits", "requests"):
        current = _child(resources, section)
        for key in replaced & current.keys():
            del current[key]
        current.update(values)


def canonical_resources(held: ContainerAssignment, config: DialectConfig) -> dict[str, str]:
    """The canonical resources (configured names) a placed container is rewritten to."""
    rn = config.names
    canonical = canonical_quantities(held)
    values = {rn.vcuda_memory: canonical[names.RESOURCE_VCUDA_MEMORY]}
    # Best effort (no compute reserved) is written as memory alone, as TKEStack spells it.
    if any(d.cores for d in held.devices):
        values[rn.vcuda_core] = canonical[names.RESOURCE_VCUDA_CORE]
    return values


def set_env(container: dict[str, Any], name: str, value: str) -> None:
    """Set one variable, replacing any entry of that name (explicit env beats envFrom).
    Also used for ephemeral containers (``webhook.admission.ephemeral``)."""
    _put_named(_child_list(container, "env"), {"name": name, "value": value})


def _child(obj: dict[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    if value is None:
        value = obj[key] = {}
    if not isinstance(value, dict):
        raise podlib.PodShapeError(f".{key}", f"must be an object, not {type(value).__name__}")
    return value


def _child_list(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        value = obj[key] = []
    if not isinstance(value, list):
        raise podlib.PodShapeError(f".{key}", f"must be a list, not {type(value).__name__}")
    return value
