"""Setup the queue-mode end-to-end tests share (test_queue_e2e, test_queue_failover_e2e)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .fixtures import NodeFactory
from .harness.process import ManagedProcess
from .scheduler_harness import fracgpu_scheduler


def new_gpu_node(nodes: NodeFactory, prefix: str, *, gpus: int) -> str:
    """A GPU node of a name no earlier test used: the control plane is shared by the session,
    and the queue is cluster-wide."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    nodes.gpu_node(name, gpus=gpus)
    return name


@contextmanager
def scheduler_running(
    binary: Path, work: Path, kubeconfig: Path, extender_port: int, *, leader_elect: bool = False
) -> Iterator[ManagedProcess]:
    """The fracgpu scheduler calling the extender on ``extender_port``, stopped on the way out."""
    scheduler = fracgpu_scheduler(
        binary, work / "scheduler", kubeconfig, extender_port, {}, leader_elect=leader_elect
    )
    scheduler.start()
    try:
        yield scheduler
    finally:
        scheduler.stop()
