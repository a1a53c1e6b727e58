"""Publish this node's GPUs to its GPUNode object (status.devices and driver versions).

The agent owns only ``status.devices``, ``status.driverVersion``,
``status.cudaDriverVersion`` and ``status.updatedAt``; the webhook side owns the rest of
the status (reservations, allocated, summary). So the agent writes a JSON merge patch of
just its fields to the status subresource, guarded by the resourceVersion it read, and
only when its fields differ from what is stored.
"""

import dataclasses
import datetime
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from agent.discovery import NodeGPUs
from fracgpu.codec import encode_device
from fracgpu.names import API_VERSION, CRD_VERSION, GPUNODE_KIND, GPUNODE_PLURAL, GROUP

log = logging.getLogger(__name__)

_MAX_CONFLICT_RETRIES = 5
_TIMEOUT_SECONDS = 10


class InventoryError(Exception):
    """The GPUNode could not be written; says what the API answered."""


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def desired_status(gpus: NodeGPUs, health: dict[str, bool]) -> dict[str, Any]:
    devices = []
    for device in gpus.devices:
        encoded = encode_device(
            dataclasses.replace(device, healthy=health.get(device.uuid, device.healthy))
        )
        if not encoded.get("pciBusId"):
            # Optional in the CRD; the apiserver rejects an empty string in a merge patch.
            encoded.pop("pciBusId", None)
        devices.append(encoded)
    return {
        "devices": devices,
        "driverVersion": gpus.driver_version,
        "cudaDriverVersion": gpus.cuda_driver_version,
    }


def _ignore_spec(_spec: Mapping[str, Any]) -> None:
    return None


class InventoryPublisher:
    """Writes the GPUNode's status; hands each spec it reads to ``on_spec`` (node settings)."""

    def __init__(
        self,
        custom_api: Any,
        node_name: str,
        now: Callable[[], str] = _utc_now,
        on_spec: Callable[[Mapping[str, Any]], None] = _ignore_spec,
    ) -> None:
        self._api = custom_api
        self._node = node_name
        self._now = now
        self._on_spec = on_spec

    def _get(self) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self._api.get_cluster_custom_object(
                GROUP, CRD_VERSION, GPUNODE_PLURAL, self._node, _request_timeout=_TIMEOUT_SECONDS
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise InventoryError(
                f"reading GPUNode {self._node} failed: {error.status} {error.reason}"
            ) from None
        return obj

    def _create(self) -> dict[str, Any]:
        body = {
            "apiVersion": API_VERSION,
            "kind": GPUNODE_KIND,
            "metadata": {"name": self._node, "labels": {"app.kubernetes.io/managed-by": "fracgpu"}},
            "spec": {},
        }
        try:
            obj: dict[str, Any] = self._api.create_cluster_custom_object(
                GROUP, CRD_VERSION, GPUNODE_PLURAL, body, _request_timeout=_TIMEOUT_SECONDS
            )
        except ApiException as error:
            if error.status == 409:  # created meanwhile (e.g. by an operator); use it
                found = self._get()
                if found is not None:
                    return found
            raise InventoryError(
                f"creating GPUNode {self._node} failed: {error.status} {error.reason}"
            ) from None
        log.info("GPUNode created", extra={"node": self._node})
        return obj

    def publish(self, gpus: NodeGPUs, health: dict[str, bool]) -> bool:
        """Make the stored inventory match; True when something was written."""
        desired = desired_status(gpus, health)
        for _ in range(_MAX_CONFLICT_RETRIES):
            current = self._get() or self._create()
            self._on_spec(current.get("spec") or {})
            status = current.get("status") or {}
            if all(status.get(key) == value for key, value in desired.items()):
                return False
            patch = {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "status": {**desired, "updatedAt": self._now()},
            }
            try:
                self._api.patch_cluster_custom_object_status(
                    GROUP,
                    CRD_VERSION,
                    GPUNODE_PLURAL,
                    self._node,
                    patch,
                    _request_timeout=_TIMEOUT_SECONDS,
                )
            except ApiException as error:
                if error.status in (404, 409):
                    continue  # deleted or changed since we read it: read again
                raise InventoryError(
                    f"updating GPUNode {self._node} status failed: {error.status} "
                    f"{error.reason}: {error.body}"
                ) from None
            log.info(
                "GPUNode inventory published",
                extra={"node": self._node, "gpus": len(gpus.devices)},
            )
            return True
        raise InventoryError(
            f"GPUNode {self._node} kept changing; gave up after {_MAX_CONFLICT_RETRIES} tries"
        )


class InventoryLoop:
    """Publishes at start, on every health change, and every ``resync_seconds``."""

    def __init__(
        self,
        publisher: InventoryPublisher,
        gpus: NodeGPUs,
        health: Callable[[], dict[str, bool]],
        resync_seconds: float,
    ) -> None:
        self._publisher = publisher
        self._gpus = gpus
        self._health = health
        self._resync = resync_seconds
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def health_changed(self, _health: dict[str, bool]) -> None:
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="inventory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self._publisher.publish(self._gpus, self._health())
            except Exception as error:  # the API can be unreachable for a while; keep going
                log.warning("inventory publish failed; will retry", extra={"error": str(error)})
                # Back off a little, but a health change still wakes us early.
                self._wake.wait(min(self._resync, 5.0))
                continue
            self._wake.wait(self._resync)
