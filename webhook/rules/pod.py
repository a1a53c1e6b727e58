"""Typed, defensive reads of a pod object as it arrives in a review (plain JSON dicts).

The API server has decoded the pod before admission, but the webhook must not trust that:
every shape problem becomes a ``PodShapeError`` with the path that is wrong.
"""

from collections.abc import Iterator, Mapping
from typing import Any, Final

from fracgpu import names
from fracgpu.errors import FracgpuError

INIT_CONTAINERS: Final = "initContainers"
CONTAINERS: Final = "containers"
EPHEMERAL_CONTAINERS: Final = "ephemeralContainers"
# Containers fracgpu places and rewrites (ephemeral debug containers are only checked).
PLACED_FIELDS: Final = (INIT_CONTAINERS, CONTAINERS)
ALL_FIELDS: Final = (INIT_CONTAINERS, CONTAINERS, EPHEMERAL_CONTAINERS)


class PodShapeError(FracgpuError):
    """The pod object does not have the shape of a v1 Pod."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(f"pod {path}: {problem}")


def mapping_at(obj: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if type(value) is not dict and not isinstance(value, Mapping):  # exact type first: fast
        raise PodShapeError(f"{path}.{key}", f"must be an object, not {type(value).__name__}")
    return value


def metadata(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping_at(pod, "metadata", "")


def string_map(pod: Mapping[str, Any], key: str) -> dict[str, str]:
    """metadata.annotations or metadata.labels as a str -> str dict."""
    return _strings(mapping_at(metadata(pod), key, ".metadata"), key)


def _strings(raw: Mapping[str, Any], key: str) -> dict[str, str]:
    """``raw`` (metadata member ``key``) as a str -> str dict, each value checked."""
    result: dict[str, str] = {}
    for k, v in raw.items():
        if not isinstance(v, str):
            raise PodShapeError(f".metadata.{key}[{k}]", "must be a string")
        result[str(k)] = v
    return result


def annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    return string_map(pod, "annotations")


def labels(pod: Mapping[str, Any]) -> dict[str, str]:
    return string_map(pod, "labels")


def spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping_at(pod, "spec", "")


def containers(
    pod: Mapping[str, Any], fields: tuple[str, ...] = PLACED_FIELDS
) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """(field, index, container) for every container under the given spec fields."""
    pod_spec = spec(pod)
    for field in fields:
        items = pod_spec.get(field)
        if items is None:
            continue
        if not isinstance(items, list):
            raise PodShapeError(f".spec.{field}", f"must be a list, not {type(items).__name__}")
        for index, item in enumerate(items):
            if type(item) is not dict and not isinstance(item, Mapping):
                raise PodShapeError(f".spec.{field}[{index}]", "must be an object")
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise PodShapeError(f".spec.{field}[{index}].name", "must be a non-empty string")
            yield field, index, item


def container_names(pod: Mapping[str, Any], fields: tuple[str, ...]) -> list[str]:
    return [c["name"] for _, _, c in containers(pod, fields)]


def env_entries(container: Mapping[str, Any], path: str) -> list[Mapping[str, Any]]:
    env = container.get("env")
    if env is None:
        return []
    if not isinstance(env, list) or not all(isinstance(e, Mapping) for e in env):
        raise PodShapeError(f"{path}.env", "must be a list of objects")
    for i, entry in enumerate(env):
        if not isinstance(entry.get("name"), str):
            raise PodShapeError(f"{path}.env[{i}].name", "must be a string")
    return env


def reserved_env(pod: Mapping[str, Any]) -> dict[str, dict[str, Mapping[str, Any]]]:
    """container name -> reserved variable name -> its env entry, over every container kind."""
    found: dict[str, dict[str, Mapping[str, Any]]] = {}
    for field, index, container in containers(pod, ALL_FIELDS):
        if container.get("env") is None:
            continue  # most containers: no env to read (and no path to spell out)
        variables = reserved_variables(container, f".spec.{field}[{index}]")
        if variables:
            found[container["name"]] = variables
    return found


def reserved_variables(container: Mapping[str, Any], path: str) -> dict[str, Mapping[str, Any]]:
    """Reserved variable name -> its env entry, in one container."""
    return {e["name"]: e for e in env_entries(container, path) if names.is_reserved_env(e["name"])}


def reserved_metadata(pod: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The fracgpu-owned annotations and labels present on the pod."""
    return {kind: _reserved_members(pod, kind) for kind in ("annotations", "labels")}


def _reserved_members(pod: Mapping[str, Any], kind: str) -> dict[str, str]:
    members = mapping_at(metadata(pod), kind, ".metadata")
    if not members:
        return {}  # nothing to check or copy
    return {k: v for k, v in _strings(members, kind).items() if names.is_reserved_metadata_key(k)}


def pod_name(pod: Mapping[str, Any]) -> str:
    """The pod's name, or ``<generateName>*`` before the API server has chosen one."""
    meta = metadata(pod)
    name = meta.get("name")
    if isinstance(name, str) and name:
        return name
    prefix = meta.get("generateName")
    return (prefix if isinstance(prefix, str) else "") + "*"


# The API server cuts a generateName longer than this before adding 5 random characters
# (apiserver's SimpleNameGenerator: 63-character names).
GENERATED_PREFIX_CHARS: Final = 58


def same_pod(placed: str, presenting: str) -> bool:
    """Whether a pod named ``presenting`` (``pod_name``) can be the pod that was ``placed``
    under that name: the same name, or any name the API server may choose for the
    ``<prefix>*`` it was placed as. (Not the first name validation sees: on a name
    collision a 1.31+ API server chooses again and validates again, without mutating
    again.) A pod's name never changes, so any other name is another pod. An empty
    ``placed`` (a reservation written without its pod's name) matches any."""
    if not placed or placed == presenting:
        return True
    return placed.endswith("*") and presenting.startswith(placed[:-1][:GENERATED_PREFIX_CHARS])
