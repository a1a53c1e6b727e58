"""Whether allocations still fit a node now: the re-check both back ends make at reserve.

Everything is read from the ClusterView, which counts admitted pods, open reservations and
claims in flight: the node's inventory, its free CPU and memory, and each GPU's free room.
"""

from collections.abc import Iterable

from fracgpu.model import GPUAllocation
from fracgpu.placement import ClusterView


def capacity_problem(
    view: ClusterView,
    node: str,
    allocations: Iterable[GPUAllocation],
    *,
    cpu_milli: int,
    memory_mib: int,
    split_count: int,
) -> str:
    """Empty when the allocations fit; otherwise what no longer has room. The rule is
    placement's own (``ClusterView.capacity_problem``); ``split_count`` is the view's default."""
    del split_count  # the view was built with it
    return view.capacity_problem(node, allocations, cpu_milli=cpu_milli, memory_mib=memory_mib)
