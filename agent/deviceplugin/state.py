"""The GPUs the device plugins advertise and their health, shared by both plugins."""

import threading
from collections.abc import Iterable

from fracgpu.model import GPUDevice


class DeviceState:
    """GPUs plus health; ``wait_for_change`` lets ListAndWatch streams sleep until news."""

    def __init__(self, devices: Iterable[GPUDevice], memory_scaling: float = 1.0) -> None:
        self._devices = tuple(devices)
        self._health = {d.uuid: d.healthy for d in self._devices}
        self._memory_scaling = memory_scaling
        self._version = 0
        self._changed = threading.Condition()

    def snapshot(self) -> tuple[int, tuple[GPUDevice, ...], dict[str, bool], float]:
        """(version, GPUs, health, memory scaling): one consistent reading."""
        with self._changed:
            return self._version, self._devices, dict(self._health), self._memory_scaling

    def set_memory_scaling(self, memory_scaling: float) -> None:
        """The node's memory scaling (it may change in its GPUNode spec): re-advertise."""
        with self._changed:
            if memory_scaling == self._memory_scaling:
                return
            self._memory_scaling = memory_scaling
            self._version += 1
            self._changed.notify_all()

    def gpus(self) -> dict[str, GPUDevice]:
        with self._changed:
            return {d.uuid: d for d in self._devices}

    def set_health(self, health: dict[str, bool]) -> None:
        with self._changed:
            merged = {uuid: health.get(uuid, old) for uuid, old in self._health.items()}
            if merged == self._health:
                return
            self._health = merged
            self._version += 1
            self._changed.notify_all()

    def wake(self) -> None:
        """Wake every waiter (a stream that ended, shutdown)."""
        with self._changed:
            self._changed.notify_all()

    def wait_for_change(self, seen_version: int, timeout: float) -> int:
        with self._changed:
            # One wait, not wait_for: wake() must also end the wait so streams can close.
            if self._version == seen_version:
                self._changed.wait(timeout)
            return self._version
