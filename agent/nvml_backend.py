"""The NVML calls the agent makes, behind one small interface.

``PynvmlBackend`` is the real one (pynvml loads ``libnvidia-ml.so.1`` from the normal
library path, so tests point it at the C test double). Every failure surfaces as
``NvmlError`` carrying NVML's return code, so callers never import pynvml.
"""

import contextlib
import ctypes
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import pynvml

# NVML return codes the agent reacts to (values fixed by nvml.h).
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
XID_CRITICAL_EVENT = 0x8  # nvmlEventTypeXidCriticalError


class NvmlError(Exception):
    """An NVML call that failed; ``code`` is NVML's nvmlReturn_t."""

    def __init__(self, call: str, code: int, message: str) -> None:
        self.call = call
        self.code = code
        super().__init__(f"{call} failed: {message} (NVML error {code})")


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    pci_bus_id: str
    mig_enabled: bool


@dataclass(frozen=True)
class DeviceUsage:
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: int


@dataclass(frozen=True)
class XidEvent:
    uuid: str
    xid: int


class NvmlBackend(Protocol):
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def device_info(self, index: int) -> DeviceInfo: ...
    def device_usage(self, uuid: str) -> DeviceUsage: ...
    def probe(self, uuid: str) -> None:
        """Raise NvmlError when the GPU does not answer a simple query."""

    def watch_xids(self, uuids: list[str]) -> None:
        """Register for critical XID events on these GPUs (once, before wait_xid)."""

    def wait_xid(self, timeout_ms: int) -> XidEvent | None:
        """The next XID event, or None when none came within the timeout."""

    def shutdown(self) -> None: ...


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def format_cuda_version(raw: int) -> str:
    """NVML reports the CUDA driver version as 1000*major + 10*minor (12020 -> "12.2")."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


class PynvmlBackend:
    """The real NVML through pynvml. One instance per process (NVML is process-global)."""

    def __init__(self) -> None:
        self._call("nvmlInit", pynvml.nvmlInit)
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}
        self._event_set: Any = None
        self._uuid_by_handle: dict[int, str] = {}

    def _call(self, name: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except pynvml.NVMLError as error:
            raise NvmlError(name, int(error.value), str(error)) from None

    def _handle(self, uuid: str) -> Any:
        with self._lock:
            if uuid not in self._handles:
                for index in range(self.device_count()):
                    handle = self._call(
                        "nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index
                    )
                    found = _text(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))
                    self._handles[found] = handle
            if uuid not in self._handles:
                raise NvmlError("nvmlDeviceGetHandleByUUID", 6, f"no GPU with UUID {uuid}")
            return self._handles[uuid]

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> str:
        raw = self._call("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion)
        return format_cuda_version(int(raw))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))

    def device_info(self, index: int) -> DeviceInfo:
        handle = self._call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index)
        uuid = _text(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))
        with self._lock:
            self._handles[uuid] = handle
        memory = self._call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
        pci = self._call("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, handle)
        return DeviceInfo(
            index=index,
            uuid=uuid,
            name=_text(self._call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle)),
            memory_total_bytes=int(memory.total),
            pci_bus_id=_text(pci.busId),
            mig_enabled=self._mig_enabled(handle),
        )

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError as error:
            # GPUs without MIG answer NOT_SUPPORTED (3) or FUNCTION_NOT_FOUND (13).
            if int(error.value) in (3, 13):
                return False
            raise NvmlError("nvmlDeviceGetMigMode", int(error.value), str(error)) from None
        return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)

    def device_usage(self, uuid: str) -> DeviceUsage:
        handle = self._handle(uuid)
        memory = self._call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
        rates = self._call(
            "nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates, handle
        )
        return DeviceUsage(int(memory.used), int(memory.total), int(rates.gpu))

    def compute_processes(self, uuid: str) -> list[tuple[int, int]]:
        """(pid, used bytes) of every compute process on the GPU, as the driver counts
        them (host PIDs; NVML's per-process accounting, whatever the process loaded)."""
        handle = self._handle(uuid)
        found = self._call(
            "nvmlDeviceGetComputeRunningProcesses",
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            handle,
        )
        # usedGpuMemory is None where the driver cannot say (NVML_VALUE_NOT_AVAILABLE).
        return [(int(p.pid), int(p.usedGpuMemory or 0)) for p in found]

    def probe(self, uuid: str) -> None:
        handle = self._handle(uuid)
        self._call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)

    def watch_xids(self, uuids: list[str]) -> None:
        if self._event_set is None:
            self._event_set = self._call("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
        for uuid in uuids:
            handle = self._handle(uuid)
            self._call(
                "nvmlDeviceRegisterEvents",
                pynvml.nvmlDeviceRegisterEvents,
                handle,
                XID_CRITICAL_EVENT,
                self._event_set,
            )
            self._uuid_by_handle[_handle_key(handle)] = uuid

    def wait_xid(self, timeout_ms: int) -> XidEvent | None:
        if self._event_set is None:
            raise NvmlError("nvmlEventSetWait", 1, "watch_xids was not called first")
        try:
            data = pynvml.nvmlEventSetWait(self._event_set, timeout_ms)
        except pynvml.NVMLError as error:
            if int(error.value) == NVML_ERROR_TIMEOUT:
                return None
            raise NvmlError("nvmlEventSetWait", int(error.value), str(error)) from None
        if not int(data.eventType) & XID_CRITICAL_EVENT:
            return None
        uuid = self._uuid_by_handle.get(_handle_key(data.device))
        if uuid is None:
            uuid = _text(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, data.device))
        return XidEvent(uuid=uuid, xid=int(data.eventData))

    def shutdown(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(pynvml.NVMLError):  # shutting down anyway
                pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        self._call("nvmlShutdown", pynvml.nvmlShutdown)


def _handle_key(handle: Any) -> int:
    """nvmlDevice_t is an opaque pointer; its address identifies the GPU."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
