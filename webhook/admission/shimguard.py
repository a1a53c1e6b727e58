"""Pod spec fields that would take a container out of the shim's reach, pure.

- Mounts over the shim's paths in a GPU container (the preload file, the library, the
  limits file, the region and node directories, their ``/run`` aliases) and mounts named
  like the shim's files (``ld.so.preload``, ``libfracgpu.so``), which an image's symlinks
  could point at the real ones. ``subPath`` does not matter: the mount point does. The one
  mount allowed there is the container's own region volume, exactly as the mutating webhook
  writes it; a region volume is mounted by no other container and nowhere else.
- hostPath volumes at, inside or above a protected host directory (the device plugins',
  kubelet's pod-resources, the agent's): mounting ``/`` or ``/var/lib`` reaches them too.
  Every pod of a managed namespace, GPU or not: a writable view of the agent's directory
  lets any container rewrite its neighbours' limits.
- Privileged GPU pods (``privileged``, ``hostPID``, or SYS_ADMIN / SYS_PTRACE / SYS_MODULE /
  ALL capabilities in any container, debug containers included): they can unmount the shim
  or reach every GPU. Allowed only where an administrator granted it (``webhook.admission.grants``).

Paths are compared after normalising them as the runtime would (``//``, ``.``, ``..``,
a trailing ``/``), as the pod spec cannot contain anything else that changes them.
"""

import posixpath
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from fracgpu import names, region_volume
from fracgpu.quantity import shown
from webhook.rules import pod as podlib

# What the device plugin mounts into a GPU container, and the directories that are fracgpu's.
_CONTAINER_OWNED: Final = (
    names.CONTAINER_PRELOAD_PATH,
    posixpath.dirname(names.CONTAINER_LIMITS_PATH),
    posixpath.dirname(posixpath.dirname(names.CONTAINER_LIBRARY_PATH)),
    names.CONTAINER_REGION_DIR,
    names.CONTAINER_NODE_DIR,
    # /var/run is a link to /run in nearly every image.
    names.CONTAINER_REGION_DIR.replace("/var/run/", "/run/", 1),
    names.CONTAINER_NODE_DIR.replace("/var/run/", "/run/", 1),
)
_SHIM_FILE_NAMES: Final = frozenset(
    {
        posixpath.basename(names.CONTAINER_PRELOAD_PATH),
        posixpath.basename(names.CONTAINER_LIBRARY_PATH),
    }
)
PRIVILEGED_CAPABILITIES: Final = frozenset({"SYS_ADMIN", "SYS_PTRACE", "SYS_MODULE", "ALL"})
MAX_FINDINGS: Final = 8


def normalise(path: str) -> str:
    """An absolute, normalised path ("/a//b/./c/../" -> "/a/b")."""
    return posixpath.normpath("/" + path.lstrip("/"))


def _within(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it (both normalised)."""
    return root in (path, "/") or path.startswith(root + "/")


def container_findings(
    pod: Mapping[str, Any], is_gpu: Callable[[object], bool]
) -> tuple[list[str], list[str]]:
    """(mounts of GPU containers that cover or alias one of the shim's paths, privileges of
    any container: ``privileged``, dangerous capabilities, and the pod's ``hostPID``). One
    pass; containers that mount nothing and set no securityContext (most) cost a lookup."""
    mounts: list[str] = []
    pod_spec = podlib.spec(pod)
    privileges = [".spec.hostPID=true"] if pod_spec.get("hostPID") is True else []
    for field in podlib.ALL_FIELDS:
        items = pod_spec.get(field)
        if not items:
            continue
        if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
            raise podlib.PodShapeError(f".spec.{field}", "must be a list of objects")
        for index, container in enumerate(items):
            if container.get("securityContext"):
                privileges.extend(_container_privileges(container, f".spec.{field}[{index}]"))
            if "volumeMounts" not in container and "volumeDevices" not in container:
                continue
            where = f".spec.{field}[{index}]"
            own = _own_region_mount(container, pod_spec, where)
            mounts.extend(_region_volume_mounts(container, where, own))
            if is_gpu(container.get("name")):
                mounts.extend(_shim_mounts(container, where, own))
    return mounts, privileges


def _own_region_mount(container: Mapping[str, Any], pod_spec: Mapping[str, Any], where: str) -> int:
    """The index of the container's mount of its own region volume, exactly as fracgpu writes
    both (``fracgpu.region_volume``); -1 when it has none. Malformed lists are refused here."""
    _objects(container, "volumeMounts", where)
    _objects(pod_spec, "volumes", ".spec")
    return region_volume.own_mount_index(container, pod_spec)


def region_volume_findings(containers: Iterable[Mapping[str, Any]], field: str) -> list[str]:
    """Mounts of region volumes by ``containers`` (debug containers being added, which have
    no region volume of their own), named by their names as ``container_privileges`` does."""
    return [
        finding
        for container in containers
        for finding in _region_volume_mounts(
            container, f'.spec.{field}["{shown(str(container.get("name")))}"]', -1
        )
    ]


def debug_region_denial(findings: list[str]) -> str:
    return (
        f"this debug container mounts a GPU container's region volume: {_shown(findings)}. "
        "The region volume holds that container's GPU accounting, which only it may write: "
        "mount other volumes"
    )


def _region_volume_mounts(container: Mapping[str, Any], where: str, own: int) -> list[str]:
    """Mounts of region volumes but the container's own at its region directory: one
    container's region is no other's to write, nor to be mounted anywhere else, and it is
    the memory-backed emptyDir fracgpu writes (never the host's disk)."""
    name = container.get("name")
    mine = names.region_volume_name(name) if isinstance(name, str) else None
    found = []
    for i, entry in enumerate(_objects(container, "volumeMounts", where)):
        volume = entry.get("name")
        if i == own or not isinstance(volume, str):
            continue
        if volume == mine:
            why = (
                f"its region volume: mounted once, at {names.CONTAINER_REGION_DIR}, and the "
                f"emptyDir of medium {names.REGION_VOLUME_MEDIUM} and sizeLimit "
                f"{names.REGION_VOLUME_SIZE_LIMIT} fracgpu writes"
            )
        elif volume.startswith(names.REGION_VOLUME_PREFIX):
            why = "a fracgpu region volume: only its own container mounts it"
        else:
            continue
        found.append(f"{where}.volumeMounts[{i}].name={shown(volume)} ({why})")
    return found


def _shim_mounts(container: Mapping[str, Any], where: str, own: int) -> list[str]:
    """Mounts at, over or inside the shim's paths, but the container's own region mount."""
    found = []
    for member, key in (("volumeMounts", "mountPath"), ("volumeDevices", "devicePath")):
        for i, entry in enumerate(_objects(container, member, where)):
            if member == "volumeMounts" and i == own:
                continue
            raw = entry.get(key)
            if not isinstance(raw, str):
                continue  # the API server requires it; nothing to mount without one
            path = normalise(raw)
            if (
                path == "/"
                or posixpath.basename(path) in _SHIM_FILE_NAMES
                or any(_within(path, owned) for owned in _CONTAINER_OWNED)
            ):
                found.append(f"{where}.{member}[{i}].{key}={shown(raw)}")
    return found


# A host directory that reaches every other one, read-only mount or not: /proc/<pid>/root
# is a process's whole filesystem (another container's, with its writable mounts). Protected
# whatever the protected_host_paths setting says.
ALWAYS_PROTECTED_HOST_PATHS: Final = ("/proc",)
# Host directories safe to read but not to write: cgroup v1 device files grant devices, and
# a GPU's PCI files remove or reset it under every tenant. Refused mounted writable only
# (monitoring agents mount /sys/fs/cgroup read-only).
WRITE_PROTECTED_HOST_PATHS: Final = ("/sys",)


def protected_host_paths(configured: Iterable[str]) -> tuple[str, ...]:
    """The host directories ``host_path_findings`` guards whatever the mount: the
    setting's, and /proc."""
    return (*configured, *ALWAYS_PROTECTED_HOST_PATHS)


def host_path_findings(pod: Mapping[str, Any], roots: Iterable[str]) -> list[str]:
    """hostPath volumes at, inside or above a protected host directory (``roots``:
    normalised, as the settings hold them), or inside a write-protected one and mounted
    writable by some container."""
    pod_spec = podlib.spec(pod)
    if not pod_spec.get("volumes"):
        return []
    found = []
    writable: set[str] | None = None  # volume names some container mounts writable
    for i, volume in enumerate(_objects(pod_spec, "volumes", ".spec")):
        if "hostPath" not in volume:
            continue
        host = volume.get("hostPath")
        raw = host.get("path") if isinstance(host, Mapping) else None
        if not isinstance(raw, str):
            continue
        path = normalise(raw)
        hit = next((r for r in roots if _within(path, r) or _within(r, path)), None)
        if hit is not None:
            found.append(f".spec.volumes[{i}].hostPath.path={shown(raw)} (reaches {hit})")
            continue
        guarded = next((r for r in WRITE_PROTECTED_HOST_PATHS if _within(path, r)), None)
        if guarded is None:
            continue
        if writable is None:
            writable = _writable_volumes(pod_spec)
        if volume.get("name") in writable:
            found.append(
                f".spec.volumes[{i}].hostPath.path={shown(raw)} (inside {guarded}, "
                "mounted writable)"
            )
    return found


def _writable_volumes(pod_spec: Mapping[str, Any]) -> set[str]:
    """Names of the volumes that some container (of any kind) mounts without readOnly."""
    names_found = set()
    for field in podlib.ALL_FIELDS:
        for index, container in enumerate(_objects(pod_spec, field, ".spec")):
            where = f".spec.{field}[{index}]"
            for mount in _objects(container, "volumeMounts", where):
                if mount.get("readOnly") is not True and isinstance(mount.get("name"), str):
                    names_found.add(mount["name"])
    return names_found


def container_privileges(containers: Iterable[Mapping[str, Any]], field: str) -> list[str]:
    """``privileged_findings`` for some containers of a list, named by their names (debug
    containers being added)."""
    found = []
    for container in containers:
        found.extend(_container_privileges(container, f'.spec.{field}["{container["name"]}"]'))
    return found


def _container_privileges(container: Mapping[str, Any], where: str) -> list[str]:
    context = podlib.mapping_at(container, "securityContext", where)
    if not context:
        return []
    found = []
    if context.get("privileged") is True:
        found.append(f"{where}.securityContext.privileged=true")
    capabilities = podlib.mapping_at(context, "capabilities", f"{where}.securityContext")
    added = capabilities.get("add") or []
    if not isinstance(added, list):
        raise podlib.PodShapeError(
            f"{where}.securityContext.capabilities.add", "must be a list of capability names"
        )
    for name in added:
        if isinstance(name, str) and name.upper().removeprefix("CAP_") in PRIVILEGED_CAPABILITIES:
            found.append(f"{where}.securityContext.capabilities.add={name}")
    return found


def mount_denial(findings: list[str]) -> str:
    return (
        f"this pod mounts over fracgpu's shim in a GPU container: {_shown(findings)}. "
        f"fracgpu mounts the shim and each GPU container's region volume there "
        f"({', '.join(_CONTAINER_OWNED[:5])}), and files named "
        f"{' or '.join(sorted(_SHIM_FILE_NAMES))} are reserved for it: mount the volume at "
        "another path, and leave the fracgpu-region-* volumes as fracgpu writes them"
    )


def host_path_denial(findings: list[str], protected: Iterable[str]) -> str:
    write_guarded = ", ".join(WRITE_PROTECTED_HOST_PATHS)
    return (
        f"this pod mounts host directories that hold or reach GPU containers' limits, the "
        f"device plugins' sockets or the node's devices: {_shown(findings)}. hostPath volumes "
        f"may not be at, inside or above {', '.join(protected)}, nor inside {write_guarded} "
        "unless every container mounts them readOnly: mount a narrower host path, or run the "
        f"pod in a namespace fracgpu does not manage (label {names.NAMESPACE_LABEL_OPT_OUT}=true)"
    )


# Pod annotations with which a container runtime injects devices into the pod's containers:
# CDI's (containerd 2 and CRI-O read them where CDI is on) and the NRI device plugins'. With
# the NVIDIA CDI spec on a node, one of them gives a container every GPU, with no shim.
DEVICE_INJECTION_PREFIXES: Final = ("cdi.k8s.io/", "cdi-devices.nri.io/", "devices.nri.io/")


def device_injection_findings(annotations: Mapping[str, Any]) -> list[str]:
    """The pod's annotations that ask the runtime to inject devices, quoted in part."""
    return sorted(
        f"annotation {shown(key)}"
        for key in annotations
        if isinstance(key, str) and key.startswith(DEVICE_INJECTION_PREFIXES)
    )


def device_injection_denial(findings: list[str]) -> str:
    return (
        f"this pod sets {_shown(findings)}, which asks the container runtime to inject "
        "devices (CDI or NRI) past fracgpu's device plugin: a GPU injected so has no slice. "
        f"Remove the annotation; GPUs are asked for with GPU resources, or run the pod in a "
        f"namespace fracgpu does not manage (label {names.NAMESPACE_LABEL_OPT_OUT}=true)"
    )


def _shown(findings: list[str]) -> str:
    shown = findings[:MAX_FINDINGS]
    more = f" and {len(findings) - len(shown)} more" if len(findings) > len(shown) else ""
    return ", ".join(shown) + more


def _objects(obj: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    items = obj.get(key)
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
        raise podlib.PodShapeError(f"{where}.{key}", "must be a list of objects")
    return items
