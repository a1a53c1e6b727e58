"""The agent's only contact with the shim file ABI (limits file, accounting region).

PROVISIONAL: until ``fracgpu/shim_abi.py`` (owned by the shim) lands, this writes the keys
of shim/include/fracgpu_abi.h directly; it is replaced by calls into fracgpu.shim_abi.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.limits import ContainerLimits


def encode_limits(limits: "ContainerLimits") -> str:
    lines = [
        "version=1",
        f"mode={'whole' if limits.whole else 'sliced'}",
        f"namespace={limits.namespace}",
        f"pod={limits.pod}",
        f"container={limits.container}",
    ]
    if limits.pod_uid:
        lines.append(f"pod_uid={limits.pod_uid}")
    lines.append(f"compute_limit_enabled={int(limits.compute_limit_enabled)}")
    lines.append(f"device_count={len(limits.devices)}")
    for i, device in enumerate(limits.devices):
        lines.append(f"device.{i}.uuid={device.uuid}")
        lines.append(f"device.{i}.memory_limit_bytes={device.memory_limit_bytes}")
        if device.core_limit is not None:
            lines.append(f"device.{i}.core_limit={device.core_limit}")
    return "\n".join(lines) + "\n"
