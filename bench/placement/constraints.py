"""``fracgpu-bench placement-constraints``: decision latency per pod shape, constraints included.

The openb cluster (6,212 GPUs) is filled to ``--fill`` of its GPU capacity with the default
trace's pods, then pods of each shape are placed in turn, each decision timed: a plain
sharing pod, one whose nodeSelector matches half the nodes, one whose required node affinity
matches another half, one that tolerates every taint but a tenth of the nodes are tainted
with one it does not tolerate, one limited to a GPU model, a multi-GPU pod, and the
nodeSelector pod in the form the webhook used to send it (a list of the allowed nodes' GPU
UUIDs). The webhook turns nodeSelector, affinity and tolerations into the set of nodes they
allow (``Constraints.nodes``); this measures what placement makes of that set.

Every placed pod is counted, and the pod placed ``--window`` decisions earlier is released,
so the cluster stays near ``--fill``. Every ``--churn`` decisions a node leaves and comes
back (a topology change: cached masks and indexes are rebuilt), and the decision right after
each churn is also reported on its own.
"""

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.placement.cli import PathKeepingHelpFormatter, add_trace_arguments
from bench.placement.replay import arrival_order, capacity_milli
from bench.placement.report import text_table
from bench.placement.trace import (
    MILLI_PER_GPU,
    TraceError,
    TraceNode,
    read_nodes,
    read_pods,
    to_demand,
    to_inventory,
)
from fracgpu.model import ContainerRequest, GPUAllocation, MemoryRequest
from fracgpu.placement import ClusterView, Constraints, Placement, PodDemand, Policy

TARGET_P99_MS = 2.0
ANYWHERE = Constraints()


@dataclass(frozen=True)
class ShapeResult:
    shape: str
    decisions: int
    placed: int
    cpu_ms: np.ndarray  # this thread's CPU time per decision
    wall_ms: np.ndarray
    after_churn_ms: np.ndarray  # wall time of the decisions right after a churn
    after_churn_cpu_ms: np.ndarray  # and their CPU time (other processes cannot inflate it)


def shapes(nodes: Sequence[TraceNode], seed: int) -> dict[str, PodDemand]:
    """The pod shapes measured, on this node list (node sets drawn with ``seed``)."""
    rng = np.random.default_rng(seed)
    names = [n.name for n in nodes]
    half = len(names) // 2
    order = rng.permutation(len(names))
    selector = frozenset(names[int(i)] for i in order[:half])
    affinity = frozenset(names[int(i)] for i in rng.permutation(len(names))[:half])
    tainted = {names[int(i)] for i in rng.permutation(len(names))[: len(names) // 10]}
    tolerated = frozenset(n for n in names if n not in tainted)
    models = sorted(
        {n.model for n in nodes if n.gpus},
        key=lambda m: -sum(x.gpus for x in nodes if x.model == m),
    )

    def share(constraints: Constraints = ANYWHERE, gpus: int = 1, milli: int = 500) -> PodDemand:
        request = ContainerRequest("main", gpus, milli, MemoryRequest(mib=0))
        return PodDemand(
            (request,), cpu_milli=4000 * gpus, memory_mib=16384, constraints=constraints
        )

    by_uuid = tuple(f"{n.name}/gpu{i}" for n in nodes if n.name in selector for i in range(n.gpus))
    return {
        "plain": share(),
        "nodeSelector (half the nodes)": share(Constraints(nodes=selector)),
        "required affinity (another half)": share(Constraints(nodes=affinity)),
        "tolerations (10 % tainted)": share(Constraints(nodes=tolerated)),
        f"GPU model {models[0]}": share(
            Constraints(include_models=(models[0],), exact_models=True)
        ),
        "multi-GPU (4 whole GPUs)": share(gpus=4, milli=MILLI_PER_GPU),
        "multi-GPU + nodeSelector": share(Constraints(nodes=selector), gpus=2, milli=MILLI_PER_GPU),
        "nodeSelector as GPU UUIDs": share(Constraints(include_uuids=by_uuid)),
    }


def fill(
    view: ClusterView,
    nodes: Sequence[TraceNode],
    *,
    pods_path: Path,
    fraction: float,
    policy: Policy,
    seed: int,
) -> int:
    """Place the trace's pods in arrival order until ``fraction`` of the GPU is asked for."""
    pods = read_pods(pods_path)
    capacity = capacity_milli(nodes)
    arrived = placed = 0
    for index in arrival_order(pods, seed, 1.3, capacity):
        pod = pods[index]
        if arrived + pod.gpu_request > fraction * capacity:
            break
        arrived += pod.gpu_request
        demand = to_demand(pod)
        view.observe(demand)
        result = view.place(demand, policy)
        if isinstance(result, Placement):
            _take(view, result, demand)
            placed += 1
    return placed


def _take(view: ClusterView, placement: Placement, demand: PodDemand) -> list[GPUAllocation]:
    allocations = [a for c in placement.containers for a in c.devices]
    view.allocate(placement.node, allocations, demand.cpu_milli, demand.memory_mib)
    return allocations


def measure(
    view: ClusterView,
    nodes: Sequence[TraceNode],
    demands: dict[str, PodDemand],
    *,
    policy: Policy,
    decisions: int,
    window: int,
    churn: int,
) -> list[ShapeResult]:
    names = list(demands)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    after: dict[str, list[float]] = {n: [] for n in names}
    after_cpu: dict[str, list[float]] = {n: [] for n in names}
    placed = dict.fromkeys(names, 0)
    held: list[tuple[str, list[GPUAllocation], int, int]] = []
    churned = [n for n in nodes if n.gpus][:: max(1, len(nodes) // 97)]
    just_churned = False
    for k in range(decisions * len(names)):
        name = names[k % len(names)]
        demand = demands[name]
        view.observe(demand)
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        result = view.place(demand, policy)
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        cpu[name].append((c1 - c0) / 1e6)
        wall[name].append((t1 - t0) / 1e6)
        if just_churned:
            after[name].append((t1 - t0) / 1e6)
            after_cpu[name].append((c1 - c0) / 1e6)
            just_churned = False
        if isinstance(result, Placement):
            held.append(
                (result.node, _take(view, result, demand), demand.cpu_milli, demand.memory_mib)
            )
            placed[name] += 1
        if len(held) > window:
            node, allocations, cpu_milli, memory_mib = held.pop(0)
            view.release(node, allocations, cpu_milli, memory_mib)
        if churn and (k + 1) % churn == 0:
            # A node with nothing of ours on it leaves and comes back (its usage is forgotten
            # by the view, so pick one we hold nothing on).
            busy = {h[0] for h in held}
            gone = next(
                (n for n in churned[(k // churn) % len(churned) :] if n.name not in busy), None
            )
            if gone is not None:
                view.remove_node(gone.name)
                view.add_node(to_inventory(gone))
                just_churned = True
    return [
        ShapeResult(
            n,
            len(cpu[n]),
            placed[n],
            np.array(cpu[n]),
            np.array(wall[n]),
            np.array(after[n]),
            np.array(after_cpu[n]),
        )
        for n in names
    ]


def table(results: Sequence[ShapeResult]) -> str:
    header = (
        "pod shape",
        "placed",
        "CPU p50 ms",
        "CPU p99 ms",
        "wall p99 ms",
        "wall max ms",
        "after churn max ms (CPU)",
    )
    rows = [
        (
            r.shape,
            f"{r.placed}/{r.decisions}",
            f"{np.percentile(r.cpu_ms, 50):.3f}",
            f"{np.percentile(r.cpu_ms, 99):.3f}",
            f"{np.percentile(r.wall_ms, 99):.3f}",
            f"{r.wall_ms.max():.2f}",
            (
                f"{r.after_churn_ms.max():.2f} ({r.after_churn_cpu_ms.max():.2f})"
                if len(r.after_churn_ms)
                else "-"
            ),
        )
        for r in results
    ]
    return text_table(header, rows)


def churn_summary(results: Sequence[ShapeResult]) -> str:
    """The decisions right after a node left and came back, whatever their shape."""
    cpu = np.concatenate([r.after_churn_cpu_ms for r in results])
    wall = np.concatenate([r.after_churn_ms for r in results])
    if not len(cpu):
        return "first decision after a node churn: no churn happened"
    return (
        f"first decision after a node churn ({len(cpu)} churns): CPU median "
        f"{np.median(cpu):.2f} ms, max {cpu.max():.2f} ms; wall max {wall.max():.2f} ms"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fracgpu-bench placement-constraints",
        description=__doc__.split("\n\n")[0],
        formatter_class=PathKeepingHelpFormatter,
    )
    add_trace_arguments(parser, "pods that fill the cluster before timing", [Policy.FRAGMENTATION])
    parser.add_argument(
        "--fill",
        type=float,
        default=0.6,
        help="share of the cluster's GPUs asked before timing, 0 to 1 (default: %(default)s)",
    )
    parser.add_argument(
        "--decisions",
        type=int,
        default=300,
        help="timed decisions per pod shape (default: %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=200,
        help="placed pods held at once; older ones leave (default: %(default)s)",
    )
    parser.add_argument(
        "--churn",
        type=int,
        default=500,
        help="decisions between node churns, 0 for none (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=42,
        help="seed of the fill order and of the node sets the constrained shapes ask for "
        "(default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.fill <= 1 or args.decisions < 1 or args.window < 0 or args.churn < 0:
        print(
            "fracgpu-bench placement-constraints: use --fill in [0, 1], --decisions 1 or more, "
            "--window and --churn 0 or more",
            file=sys.stderr,
        )
        return 2
    try:
        nodes = read_nodes(args.nodes)
        pods_path = args.pods
        demands = shapes(nodes, args.seed)
        worst = 0.0
        for policy in args.policy:
            view = ClusterView(
                (to_inventory(n) for n in nodes),
                default_split_count=MILLI_PER_GPU,
                gpu_units=MILLI_PER_GPU,
            )
            filled = fill(
                view,
                nodes,
                pods_path=pods_path,
                fraction=args.fill,
                policy=policy,
                seed=args.seed,
            )
            gpus = capacity_milli(nodes) // MILLI_PER_GPU
            print(
                f"policy {policy.value}: {len(nodes)} nodes, {gpus} GPUs, {filled} pods placed "
                f"to fill {args.fill:.0%}; {args.decisions} decisions per shape, churn every "
                f"{args.churn}",
                flush=True,
            )
            results = measure(
                view,
                nodes,
                demands,
                policy=policy,
                decisions=args.decisions,
                window=args.window,
                churn=args.churn,
            )
            print(table(results))
            print(churn_summary(results))
            worst = max([worst, *(float(np.percentile(r.cpu_ms, 99)) for r in results)])
    except TraceError as e:
        print(f"fracgpu-bench placement-constraints: {e}", file=sys.stderr)
        return 2
    verdict = "within" if worst <= TARGET_P99_MS else "over"
    print(f"worst CPU p99 {worst:.3f} ms: {verdict} the {TARGET_P99_MS:g} ms target")
    return 0
