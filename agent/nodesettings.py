"""The node settings the agent applies that its GPUNode's spec may override.

Only memory scaling matters here: the memory resource advertises physical x scaling, so
kubelet's count agrees with what the webhook places. The webhook reads the same spec field.
"""

import logging
from collections.abc import Callable, Mapping
from typing import Any

from fracgpu.codec import decode_memory_scaling
from fracgpu.errors import CodecError

log = logging.getLogger(__name__)


def memory_scaling_of(spec: Mapping[str, Any], default: float) -> float:
    """The spec's ``memoryScaling``, or the agent's setting when absent or unusable."""
    raw = spec.get("memoryScaling")
    if raw is None:
        return default
    try:
        return decode_memory_scaling("GPUNode spec", raw)
    except CodecError as error:
        # The CRD schema should have refused it; the cluster default is the safe reading.
        log.warning("ignoring the node's memory scaling", extra={"error": str(error)})
        return default


def follow_memory_scaling(
    apply: Callable[[float], None], default: float
) -> Callable[[Mapping[str, Any]], None]:
    """An ``on_spec`` callback that applies the spec's memory scaling (or the default)."""

    def on_spec(spec: Mapping[str, Any]) -> None:
        apply(memory_scaling_of(spec, default))

    return on_spec
