"""Placement: a pure choice of node and GPU(s) for a pod, given the cluster's free capacity.

``ClusterView`` holds free capacity and is updated incrementally (``allocate``/``release``);
``ClusterView.place`` never changes it, so the webhook and the trace benchmark share one code path.
"""

from fracgpu.placement.api import (
    Constraints,
    NoFit,
    NoFitReason,
    Placement,
    PodDemand,
    Policy,
)
from fracgpu.placement.view import ClusterView, Usage

__all__ = [
    "ClusterView",
    "Constraints",
    "NoFit",
    "NoFitReason",
    "Placement",
    "PodDemand",
    "Policy",
    "Usage",
]
