"""The one rule for whether a GPU can take more work, and whether a node's CPU and memory
can host a pod: every policy, the no-fit explanation, the per-class path and the
admission-time re-check use them.

It is written once over plain comparisons and ``&``, so the same function answers for one GPU
(ints) or for every GPU at once (numpy arrays).
"""

from typing import TypeVar

from fracgpu.placement.state import BoolArray, IntArray

Amount = TypeVar("Amount", int, IntArray)


def gpu_room(
    free: Amount,
    memory_free: Amount,
    containers: Amount,
    memory_total: Amount,
    split: Amount,
    *,
    cores: int,
    memory: Amount,
    units: int,
    taking: int = 1,
) -> bool | BoolArray:
    """Whether a GPU with ``free`` compute units, ``memory_free`` of ``memory_total`` MiB and
    ``containers`` of at most ``split`` can take ``taking`` more containers asking ``cores``
    and ``memory`` MiB between them.

    A whole-GPU container (``cores`` >= ``units``) needs the GPU to itself: nothing on it, all
    of its compute and memory free. Sharing containers need the compute (at least one unit:
    a container asking 0 still runs), the memory, and a slot under the split count.
    """
    if cores >= units:
        whole: bool | BoolArray = (
            (containers == 0)
            & (free >= units)
            & (memory_free >= memory_total)
            & (memory <= memory_total)
        )
        return whole & (taking == 1)
    shared: bool | BoolArray = (
        (free >= max(cores, 1)) & (memory_free >= memory) & (containers + taking <= split)
    )
    return shared


def host_room(
    cpu_free: Amount, memory_free: Amount, *, cpu_milli: int, memory_mib: int
) -> bool | BoolArray:
    """Whether a node with ``cpu_free`` millicores and ``memory_free`` MiB of host memory free
    can host a pod asking ``cpu_milli`` and ``memory_mib``."""
    room: bool | BoolArray = (cpu_free >= cpu_milli) & (memory_free >= memory_mib)
    return room
