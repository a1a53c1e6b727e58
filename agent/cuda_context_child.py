"""A process that makes one CUDA context and holds it, so the agent can see what it costs.

Run by ``agent.context_probe`` as ``python -m agent.cuda_context_child GPU-UUID``. It
retains the primary context of the GPU with that UUID (what every CUDA program's first
call makes), prints ``ready`` and keeps the context until a line or end of file arrives
on its input. Any failure prints ``error: ...`` and exits 1. It runs in its own process so
that the agent itself never holds a context: NVML then charges the memory to this PID
alone, and it is given back when the process exits, whatever happens.
"""

import ctypes
import sys
from typing import Any

CUDA_SUCCESS = 0
_UUID_BYTES = 16


class DriverCallError(Exception):
    """A driver call failed; the message names the call and the CUDA error."""


def _check(cuda: Any, call: str, result: int) -> None:
    if result == CUDA_SUCCESS:
        return
    name = ctypes.c_char_p()
    known = cuda.cuGetErrorName(result, ctypes.byref(name)) == CUDA_SUCCESS and name.value
    label = name.value.decode(errors="replace") if known and name.value else "unknown error"
    raise DriverCallError(f"{call} failed: {label} ({result})")


def nvml_uuid(raw: bytes) -> str:
    """The UUID as NVML writes it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _device_with_uuid(cuda: Any, uuid: str) -> ctypes.c_int:
    count = ctypes.c_int()
    _check(cuda, "cuDeviceGetCount", cuda.cuDeviceGetCount(ctypes.byref(count)))
    for index in range(count.value):
        device = ctypes.c_int()
        _check(cuda, "cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), index))
        raw = (ctypes.c_ubyte * _UUID_BYTES)()
        _check(cuda, "cuDeviceGetUuid", cuda.cuDeviceGetUuid(raw, device))
        if nvml_uuid(bytes(raw)).lower() == uuid.lower():
            return device
    raise DriverCallError(f"none of the {count.value} CUDA devices has UUID {uuid}")


def hold_context(uuid: str) -> None:
    """Retain ``uuid``'s primary context, say ``ready``, wait for input, release it."""
    try:
        cuda: Any = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise DriverCallError(
            f"cannot load libcuda.so.1 ({error}): the agent needs the driver's compute "
            "library (NVIDIA_DRIVER_CAPABILITIES with compute)"
        ) from None
    _check(cuda, "cuInit", cuda.cuInit(0))
    device = _device_with_uuid(cuda, uuid)
    context = ctypes.c_void_p()
    _check(
        cuda,
        "cuDevicePrimaryCtxRetain",
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
    )
    print("ready", flush=True)
    sys.stdin.readline()
    cuda.cuDevicePrimaryCtxRelease(device)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("error: usage: python -m agent.cuda_context_child GPU-UUID", flush=True)
        return 2
    try:
        hold_context(argv[1])
    except DriverCallError as error:
        print(f"error: {error}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
