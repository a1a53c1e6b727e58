"""Whether a container's own spec can choose its GPUs through NVIDIA_VISIBLE_DEVICES.

In immediate mode the webhook writes the variable into the container's env, where it beats
anything from envFrom. A queued pod is created before its GPU is chosen, so the device
plugin sets the variable at Allocate instead; but kubelet puts a container's env and envFrom
after the device plugin's variables, and the later value wins. A queued GPU container whose
spec could set the variable could therefore pick any GPU on the node. One rule, used by
admission and by the agent.
"""

from collections.abc import Mapping
from typing import Any

from fracgpu.model import ContainerAssignment
from fracgpu.names import ENV_VISIBLE_DEVICES


def visible_devices_override(container: Mapping[str, Any]) -> str:
    """Why this container spec could set NVIDIA_VISIBLE_DEVICES itself; "" when it cannot.

    An explicit env entry of that name can, and so can every envFrom source whose prefix
    is the start of the name (no prefix, "NVIDIA_", ...): the ConfigMap or Secret behind it
    may hold the rest of the name now or later, and kubelet reads it at each start.
    """
    env = container.get("env")
    if isinstance(env, list):
        for index, entry in enumerate(env):
            if isinstance(entry, Mapping) and entry.get("name") == ENV_VISIBLE_DEVICES:
                return f"env[{index}] sets {ENV_VISIBLE_DEVICES}"
    sources = container.get("envFrom")
    if isinstance(sources, list):
        for index, source in enumerate(sources):
            prefix = source.get("prefix") if isinstance(source, Mapping) else None
            prefix = prefix if isinstance(prefix, str) else ""
            if ENV_VISIBLE_DEVICES.startswith(prefix):
                shown = f"prefix {prefix!r}" if prefix else "no prefix"
                return (
                    f"envFrom[{index}] has {shown}, so a ConfigMap or Secret key could set "
                    f"{ENV_VISIBLE_DEVICES}; give it a prefix that {ENV_VISIBLE_DEVICES} does "
                    "not start with, or list the variables in env"
                )
    return ""


def visible_devices_value(held: ContainerAssignment) -> str:
    """The variable's value for a container placed on these GPUs: their UUIDs, in order."""
    return ",".join(device.uuid for device in held.devices)
