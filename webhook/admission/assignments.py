"""From a placement to the pod's assignment, and the check that an assignment says the same.

Besides the GPUs, an assignment carries what the node agent must apply and placement
assumed: each container's elastic compute bound (TKEStack ``vcuda-core-limit``), the node's
memory scaling (virtual memory served from the host past the physical) and whether compute
is paced on that node (HAMi ``disablecorelimit``). The webhook's settings are the cluster
defaults; a node's own values (GPUNode spec, cluster file) override them.
"""

from collections.abc import Iterable, Sequence

from fracgpu.model import Assignment, ContainerAssignment, ContainerRequest
from fracgpu.placement import ClusterView


def build(
    node: str,
    reservation_id: str,
    containers: Iterable[ContainerAssignment],
    *,
    requests: Sequence[ContainerRequest],
    view: ClusterView,
    disable_core_limit: bool,
) -> Assignment:
    asked = {r.container: r for r in requests}
    return Assignment(
        node,
        reservation_id,
        tuple(_with_requested(c, asked.get(c.container)) for c in containers),
        memory_scaling=view.memory_scaling(node),
        compute_limit=compute_limited(node, view, disable_core_limit),
    )


def _with_requested(
    container: ContainerAssignment, request: ContainerRequest | None
) -> ContainerAssignment:
    """The container's GPUs plus what it asked for besides: its elastic bound and priority."""
    if request is None or (
        request.core_limit == container.core_limit and request.priority == container.priority
    ):
        return container  # nothing to add (most pods): no new frozen value
    return ContainerAssignment(
        container.container, container.devices, request.core_limit, request.priority
    )


def compute_limited(node: str, view: ClusterView, disable_core_limit: bool) -> bool:
    inventory = view.inventory(node)
    own = inventory.compute_limit if inventory is not None else None
    return (not disable_core_limit) if own is None else own


def findings(assignment: Assignment, view: ClusterView, disable_core_limit: bool) -> list[str]:
    """Where the assignment's node settings differ from that node's settings now.

    A container's ``coreLimit`` and ``priority`` are not checked: the pod could ask for any
    of them itself, and the rewrite removes the resources that asked (no node offers them).
    """
    node = assignment.node
    if view.inventory(node) is None:
        return []  # the node left the view: its settings are unknown, the GPUs decide
    found = []
    scaling = view.memory_scaling(node)
    if assignment.memory_scaling != scaling:
        found.append(
            f"memoryScaling {assignment.memory_scaling:g} is not node {node}'s {scaling:g}"
        )
    limited = compute_limited(node, view, disable_core_limit)
    if assignment.compute_limit != limited:
        found.append(
            f"computeLimit {str(assignment.compute_limit).lower()} is not node {node}'s "
            f"{str(limited).lower()}"
        )
    return found
