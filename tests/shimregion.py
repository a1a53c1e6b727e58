"""An accounting region as a container (or its shim) leaves it: the header every test that
writes one by hand needs, from fracgpu.shim_abi's layout."""

import struct

from fracgpu import shim_abi


def blank_region(devices: int, priority: int = 0) -> bytearray:
    """A region of ``devices`` GPUs whose header says ``priority``; everything else zero."""
    data = bytearray(shim_abi.REGION_SIZE)
    struct.pack_into(
        "<QIIIIII",
        data,
        0,
        shim_abi.REGION_MAGIC,
        shim_abi.REGION_VERSION,
        shim_abi.REGION_SIZE,
        shim_abi.MAX_DEVICES,
        shim_abi.MAX_PROCS,
        devices,
        priority,
    )
    return data
