"""A GPU container's region volume and its mount, as pod-spec JSON: the one shape the mutating
webhook writes, the validating webhook holds pods to, and the agent requires before a
container starts (``fracgpu.names`` has the names it is built from)."""

from collections.abc import Mapping
from typing import Any

from fracgpu import names


def volume(container: str) -> dict[str, Any]:
    """The region volume of the container named ``container`` (a ``.spec.volumes`` entry)."""
    return {
        "name": names.region_volume_name(container),
        "emptyDir": {
            "medium": names.REGION_VOLUME_MEDIUM,
            "sizeLimit": names.REGION_VOLUME_SIZE_LIMIT,
        },
    }


def mount(container: str) -> dict[str, Any]:
    """The container's mount of its region volume (a ``volumeMounts`` entry)."""
    return {
        "name": names.region_volume_name(container),
        "mountPath": names.CONTAINER_REGION_DIR,
    }


def own_mount_index(container: Mapping[str, Any], spec: Mapping[str, Any]) -> int:
    """The index in ``container``'s volumeMounts of its mount of its own region volume, both
    exactly as ``mount`` and ``volume`` write them (``spec``: the pod spec); -1 when it has
    none. Entries of any other shape are no match (the webhook refuses them by name)."""
    name = container.get("name")
    if not isinstance(name, str):
        return -1
    mounts = container.get("volumeMounts")
    volumes = spec.get("volumes")
    if not isinstance(mounts, list) or not isinstance(volumes, list):
        return -1
    wanted = mount(name)
    for index, entry in enumerate(mounts):
        if entry == wanted:
            return index if volume(name) in volumes else -1
    return -1
