"""What the guard times: a reference loop, admissions, and placements of several pod shapes.

Each function returns CPU seconds per operation (``time.process_time``: a helper's time on a
shared machine, not the wall clock). The guard divides each by the reference loop's time
measured in the same run, so a slower or busier machine moves all of them together.
"""

import random
import time
from collections.abc import Callable
from pathlib import Path

from bench.admission.cli import _cluster_file
from bench.admission.cost import admit_all
from fracgpu.model import ContainerRequest, GPUAllocation, GPUDevice, MemoryRequest, NodeInventory
from fracgpu.placement.api import Constraints, NoFit, PodDemand, Policy
from fracgpu.placement.view import ClusterView

# Placement cluster: NODES nodes of GPUS GPUs, two models and two pools, a seeded part full.
NODES = 400
GPUS = 8
MODELS = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
POOLS = ("pool-a", "pool-b")


def reference(rounds: int) -> float:
    """CPU seconds per unit of a fixed pure-Python loop (dict, list, int and str work: what
    admission and placement spend their interpreter time on)."""
    started = time.process_time()
    for _ in range(rounds):
        table: dict[str, int] = {}
        items: list[int] = []
        for i in range(2000):
            key = f"k{i % 97}"
            table[key] = table.get(key, 0) + i
            items.append(i * 7 % 13)
        items.sort()
        if sum(items) < 0 or len(table) != 97:
            raise AssertionError("the reference loop computed nonsense")
    return (time.process_time() - started) / rounds


def admission(cluster: Path, warmup: int, admissions: int) -> float:
    """CPU seconds per admission: review bytes -> ``Admission.mutate`` -> response bytes, on
    the embedded back end (reservations really taken): ``admission-cost``'s own loop."""
    return admit_all(cluster, warmup, admissions, count_instructions=False)


def write_cluster(path: Path, nodes: int, gpus: int) -> None:
    _cluster_file(path, nodes, gpus)


def _request(name: str, gpus: int, cores: int, mib: int) -> ContainerRequest:
    return ContainerRequest(name, gpus, cores, MemoryRequest(mib=mib))


# The pod shapes whose decision time is guarded: name -> (demand, policy).
SHAPES: dict[str, tuple[PodDemand, Policy]] = {
    "plain": (PodDemand((_request("main", 1, 30, 8192),)), Policy.BINPACK),
    "plain-spread": (PodDemand((_request("main", 1, 30, 8192),)), Policy.SPREAD),
    "plain-fragmentation": (PodDemand((_request("main", 1, 30, 8192),)), Policy.FRAGMENTATION),
    "pool-selector": (
        PodDemand((_request("main", 1, 30, 8192),), constraints=Constraints(pools=("pool-b",))),
        Policy.BINPACK,
    ),
    "gpu-model": (
        PodDemand((_request("main", 1, 50, 16384),), constraints=Constraints(("H100",))),
        Policy.BINPACK,
    ),
    "multi-gpu": (PodDemand((_request("main", 2, 100, 81920),)), Policy.BINPACK),
    "two-containers": (
        PodDemand((_request("a", 1, 20, 4096), _request("b", 1, 40, 8192)), 4000, 16384),
        Policy.BINPACK,
    ),
}


# A node leaves and comes back, then a pod that names half the cluster's GPUs by UUID (HAMi's
# use-gpuuuid list) is placed: what a churn costs the next constrained decision. Fewer churns
# than a compaction needs (2 x NODES + 16 node rows), so every run does the same work.
AFTER_CHURN = "uuid-list-after-churn"
CHURNS = 200


def placement_view(seed: int = 7) -> ClusterView:
    """The placement cluster, about half its GPUs partly used (seeded: the same every run)."""
    rng = random.Random(seed)
    view = ClusterView()
    for n in range(NODES):
        model = MODELS[n % len(MODELS)]
        devices = tuple(GPUDevice(f"GPU-{n:04d}-{g}", g, model, 81920) for g in range(GPUS))
        view.add_node(NodeInventory(f"node-{n:04d}", devices, 128_000, 1_048_576, POOLS[n % 2]))
        for device in devices:
            if rng.random() < 0.5:
                cores = rng.choice((10, 20, 30, 50, 100))
                view.allocate(
                    f"node-{n:04d}", (GPUAllocation(device.uuid, cores, cores * 800),), 1000, 4096
                )
    for _ in range(200):  # teach the fragmentation policy a workload
        view.observe(SHAPES["plain"][0])
        view.observe(SHAPES["two-containers"][0])
    return view


def placement(view: ClusterView, shape: str, budget_seconds: float) -> float:
    """CPU seconds per ``ClusterView.place`` of one shape (the view never changes), deciding
    in batches until ``budget_seconds`` of CPU are spent (at least 3 decisions): a shape
    whose decision takes milliseconds gets as much time as one that takes microseconds."""
    demand, policy = SHAPES[shape]
    place: Callable[[PodDemand, Policy], object] = view.place
    if isinstance(place(demand, policy), NoFit):
        raise RuntimeError(f"the guard's {shape!r} pod does not fit its cluster")
    decisions, batch = 0, 3
    started = time.process_time()
    while True:
        for _ in range(batch):
            place(demand, policy)
        decisions += batch
        used = time.process_time() - started
        if used >= budget_seconds:
            return used / decisions
        batch = min(batch * 2, 1000)


def placement_after_churn() -> float:
    """CPU seconds per node churn plus one decision of a pod that names half the cluster's
    GPUs by UUID (binpack: the constraint's masks, not a policy's index, are what a churn
    invalidates here). The churned nodes are outside the pod's list."""
    view = placement_view()
    uuids = tuple(f"GPU-{n:04d}-{g}" for n in range(0, NODES, 2) for g in range(GPUS))
    named = Constraints(include_uuids=uuids)
    demand = PodDemand((_request("main", 1, 30, 8192),), constraints=named)
    if isinstance(view.place(demand, Policy.BINPACK), NoFit):
        raise RuntimeError("the guard's UUID-list pod does not fit its cluster")
    started = time.process_time()
    for k in range(CHURNS):
        name = f"node-{(2 * k + 1) % NODES:04d}"
        inventory = view.inventory(name)
        if inventory is None:
            raise RuntimeError(f"the guard's cluster lost {name}")
        view.remove_node(name)
        view.add_node(inventory)
        view.place(demand, Policy.BINPACK)
    return (time.process_time() - started) / CHURNS
