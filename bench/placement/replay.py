"""Replaying an openb-format trace through the production placement (``ClusterView.place``).

The method follows ``shared/data/openb/README.md`` (the FGD paper's simulator):
shuffle the pods with the seed, append uniformly drawn clones until the total GPU request
would pass ``tune`` x capacity, place arrivals one by one (pods never leave), log
(arrived, used) after every pod, bin by x = round(100 * arrived / capacity) and average
100 * used / capacity per bin.
"""

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bench.placement.trace import (
    MILLI_PER_GPU,
    TraceError,
    TraceNode,
    TracePod,
    to_demand,
    to_inventory,
)
from fracgpu.placement import ClusterView, NoFitReason, Placement, Policy


@dataclass(frozen=True)
class SeedResult:
    policy: Policy
    seed: int
    pods: int
    placed: int
    alloc_by_x: dict[int, float]  # bin x -> mean allocation % of the events in it
    # bin x -> mean % of the nodes' CPU held by placed pods, GPU-less ones included: where CPU
    # binds, a policy can allocate more GPU by placing less CPU for pods without GPUs
    cpu_by_x: dict[int, float]
    refused_gpu_less: int  # pods without GPUs that found no node
    first_failure_arrived: float | None  # arrived % when the first pod failed
    # arrived % when the first whole-node pod (as many GPUs as the largest node) was refused
    # for lack of room now (pods that no node could ever hold are not counted)
    first_big_failure_arrived: float | None
    arrived_at_end: float  # arrived % after the last pod (about tune x 100)
    latencies_ns: npt.NDArray[np.int64]  # wall clock per place() call
    cpu_ns: npt.NDArray[np.int64]  # this thread's CPU time per call (immune to other load)
    wall_s: float

    def alloc_at(self, x: int) -> float:
        return self.alloc_by_x.get(x, math.nan)

    def cpu_at(self, x: int) -> float:
        return self.cpu_by_x.get(x, math.nan)


def capacity_milli(nodes: Sequence[TraceNode]) -> int:
    return sum(n.gpus for n in nodes) * MILLI_PER_GPU


def arrival_order(pods: Sequence[TracePod], seed: int, tune: float, capacity: int) -> list[int]:
    """Shuffled pod indices, then clones until one more would pass ``tune`` x capacity."""
    if not any(p.gpu_request for p in pods):
        raise TraceError("the pod list has no GPU pods, so the replay has nothing to measure")
    rng = np.random.default_rng(seed)
    order = [int(i) for i in rng.permutation(len(pods))]
    total = sum(p.gpu_request for p in pods)
    target = tune * capacity
    while True:
        clone = int(rng.integers(len(pods)))
        if total + pods[clone].gpu_request > target:
            return order
        order.append(clone)
        total += pods[clone].gpu_request


def bin_x(arrived: int, capacity: int) -> int:
    """round(100 * arrived / capacity), halves rounded up (integer arithmetic, no float ties)."""
    return (200 * arrived + capacity) // (2 * capacity)


def replay(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policy: Policy,
    seed: int,
    tune: float,
) -> SeedResult:
    started = time.perf_counter()
    capacity = capacity_milli(nodes)
    cpu_capacity = max(sum(n.cpu_milli for n in nodes), 1)
    view = ClusterView(
        (to_inventory(n) for n in nodes),
        # The README's feasibility rule has no limit on pods per GPU.
        default_split_count=MILLI_PER_GPU,
        gpu_units=MILLI_PER_GPU,
    )
    demands = [to_demand(p) for p in pods]
    if policy is Policy.FGD:
        # The paper's simulator: the target workload is the whole pod list's task types,
        # counted before the replay (the clones appended later do not change it).
        view.set_fgd_workload(demands)
    order = arrival_order(pods, seed, tune, capacity)
    whole_node = max(n.gpus for n in nodes)
    latencies = np.zeros(len(order), np.int64)
    cpu = np.zeros(len(order), np.int64)
    sums: dict[int, float] = {}
    cpu_sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    arrived = used = cpu_used = placed = refused_gpu_less = 0
    first_failure: float | None = None
    first_big_failure: float | None = None
    for k, index in enumerate(order):
        pod, demand = pods[index], demands[index]
        arrived += pod.gpu_request
        view.observe(demand)
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        result = view.place(demand, policy)
        latencies[k] = time.perf_counter_ns() - t0
        cpu[k] = time.thread_time_ns() - c0
        if isinstance(result, Placement):
            allocations = [a for c in result.containers for a in c.devices]
            view.allocate(result.node, allocations, demand.cpu_milli, demand.memory_mib)
            used += pod.gpu_request
            cpu_used += demand.cpu_milli
            placed += 1
        else:
            if not demand.containers:
                refused_gpu_less += 1
            if first_failure is None:
                first_failure = 100 * arrived / capacity
            big = pod.num_gpu >= whole_node and result.reason is NoFitReason.NOT_NOW
            if first_big_failure is None and big:
                first_big_failure = 100 * arrived / capacity
        x = bin_x(arrived, capacity)
        sums[x] = sums.get(x, 0.0) + 100 * used / capacity
        cpu_sums[x] = cpu_sums.get(x, 0.0) + 100 * cpu_used / cpu_capacity
        counts[x] = counts.get(x, 0) + 1
    return SeedResult(
        policy=policy,
        seed=seed,
        pods=len(order),
        placed=placed,
        alloc_by_x={x: sums[x] / counts[x] for x in sums},
        cpu_by_x={x: cpu_sums[x] / counts[x] for x in cpu_sums},
        refused_gpu_less=refused_gpu_less,
        first_failure_arrived=first_failure,
        first_big_failure_arrived=first_big_failure,
        arrived_at_end=100 * arrived / capacity,
        latencies_ns=latencies,
        cpu_ns=cpu,
        wall_s=time.perf_counter() - started,
    )
