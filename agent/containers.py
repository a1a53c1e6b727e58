"""The fracgpu containers running on this node right now, with their files on the host.

Kubelet's pod-resources API says which containers hold our device IDs; the allocation
directories of those containers hold their limits, which name the pod and container whose
region volume holds the accounting region (``AllocationFiles.region_for``). A directory no
live container owns is stale: it is ignored by metrics and removed after a grace period.
"""

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from agent.containerstart import PodResourcesSource
from agent.hostfiles import AllocationFiles, UntrustedFileError, allocation_key, read_untrusted
from fracgpu.errors import CodecError
from fracgpu.shim_abi import (
    REGION_SIZE,
    Limits,
    RegionDevice,
    decode_limits,
    decode_region,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveContainer:
    namespace: str
    pod: str
    container: str
    keys: tuple[str, ...]
    limits: Limits | None
    region: tuple[RegionDevice, ...] | None


def live_keys(source: PodResourcesSource, resources: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Allocation key -> (namespace, pod, container) for every container holding our IDs."""
    wanted = set(resources)
    out: dict[str, tuple[str, ...]] = {}
    for holder in source.list():
        for resource, ids in holder.devices.items():
            if resource in wanted:
                out[allocation_key(resource, ids)] = (
                    holder.namespace,
                    holder.pod,
                    holder.container,
                )
    return out


def _read_limits(files: AllocationFiles, key: str) -> Limits | None:
    text = files.read_limits(key)
    if text is None:
        return None
    try:
        return decode_limits(text.encode())
    except CodecError as error:
        log.warning("unreadable limits file", extra={"key": key, "error": str(error)})
        return None


def _read_region(
    files: AllocationFiles, keys: Iterable[str], limits: Limits | None
) -> tuple[RegionDevice, ...] | None:
    """The container's region: in its region volume, or where an older agent put it (one
    run dir per allocation, one of which kubelet mounted; the others stay empty). It is the
    container's to write: read as hostile input (a regular file of at most REGION_SIZE bytes,
    no links, FIFOs or devices)."""
    if limits is None:
        return None
    newest: tuple[float, bytes] | None = None
    for path in dict.fromkeys(files.region_for(key, limits) for key in keys):
        if path is None:
            continue
        try:
            read = read_untrusted(path, REGION_SIZE)
        except UntrustedFileError as error:
            log.warning("accounting region refused", extra={"path": str(path), "error": str(error)})
            continue
        if read is None:
            continue
        if newest is None or read.mtime > newest[0]:
            newest = (read.mtime, read.data)
    if newest is None:
        return None
    try:
        return decode_region(newest[1]).devices
    except CodecError as error:
        log.warning("unreadable accounting region", extra={"error": str(error)})
        return None


def live_containers(
    source: PodResourcesSource, resources: Iterable[str], files: AllocationFiles
) -> list[LiveContainer]:
    by_container: dict[tuple[str, ...], list[str]] = {}
    for key, who in live_keys(source, resources).items():
        by_container.setdefault(who, []).append(key)
    out = []
    for (namespace, pod, container), keys in sorted(by_container.items()):
        keys.sort()
        limits = next((lim for k in keys if (lim := _read_limits(files, k)) is not None), None)
        region = _read_region(files, keys, limits)
        out.append(LiveContainer(namespace, pod, container, tuple(keys), limits, region))
    return out


def remove_stale(
    files: AllocationFiles, live: Iterable[str], grace_seconds: float, now: float | None = None
) -> list[str]:
    """Remove allocation dirs no live container owns and untouched for ``grace_seconds``."""
    now = time.time() if now is None else now
    keep = set(live)
    removed = []
    for key in files.all_keys():
        if key in keep:
            continue
        try:
            if files.age_seconds(key, now) < grace_seconds:
                continue
        except FileNotFoundError:
            continue
        if files.remove(key):
            removed.append(key)
    if removed:
        log.info("stale allocation dirs removed", extra={"count": len(removed)})
    return removed
