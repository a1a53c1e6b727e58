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
    bounds = {r.container: r.core_limit for r in requests}
    return Assignment(
        node,
        reservation_id,
        tuple(
            ContainerAssignment(c.container, c.devices, bounds.get(c.container)) for c in containers
        ),
        memory_scaling=view.memory_scaling(node),
        compute_limit=compute_limited(node, view, disable_core_limit),
    )


def compute_limited(node: str, view: ClusterView, disable_core_limit: bool) -> bool:
    inventory = view.inventory(node)
    own = inventory.compute_limit if inventory is not None else None
    return (not disable_core_limit) if own is None else own


def findings(
    assignment: Assignment,
    requests: Sequence[ContainerRequest],
    view: ClusterView,
    disable_core_limit: bool,
) -> list[str]:
    """Where the assignment's settings differ from what fracgpu would write for this pod now."""
    expected = build(
        assignment.node,
        assignment.reservation_id,
        assignment.containers,
        requests=requests,
        view=view,
        disable_core_limit=disable_core_limit,
    )
    found = []
    for got, want in zip(assignment.containers, expected.containers, strict=True):
        if got.core_limit != want.core_limit:
            found.append(
                f"container {got.container} has coreLimit {got.core_limit} but asks for "
                f"{want.core_limit}"
            )
    if view.inventory(assignment.node) is None:
        return found  # the node left the view: its settings are unknown, the GPUs decide
    if assignment.memory_scaling != expected.memory_scaling:
        found.append(
            f"memoryScaling {assignment.memory_scaling:g} is not node {assignment.node}'s "
            f"{expected.memory_scaling:g}"
        )
    if assignment.compute_limit != expected.compute_limit:
        found.append(
            f"computeLimit {str(assignment.compute_limit).lower()} is not node "
            f"{assignment.node}'s {str(expected.compute_limit).lower()}"
        )
    return found
