"""``fracgpu-bench placement``: replay a trace per policy and seed, print the table."""

import argparse
import json
import os
import platform
import sys
import textwrap
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from bench.placement.replay import SeedResult, capacity_milli, replay
from bench.placement.report import published, ratios, summarize, table
from bench.placement.trace import TraceError, TraceNode, TracePod, read_nodes, read_pods
from fracgpu.placement import Policy

DEFAULT_POLICIES = (
    Policy.FRAGMENTATION,
    Policy.FGD,
    Policy.BEST_FIT,
    Policy.BINPACK,
    Policy.SPREAD,
)
_DATA = Path("shared") / "data" / "openb"
DEFAULT_NODES = _DATA / "openb_node_list_gpu_node.csv"
DEFAULT_PODS = _DATA / "openb_pod_list_default.csv"
DEFAULT_SEEDS = "42-51"
DEFAULT_TUNE = 1.3


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_path(relative: Path) -> Path:
    """``../shared/...`` beside the repository (CI keeps ``shared`` next to the clone)."""
    beside_repo = _repo_root().parent / relative
    return beside_repo if beside_repo.exists() else Path.cwd().parent / relative


class PathKeepingHelpFormatter(argparse.HelpFormatter):
    """Wraps help at spaces only: the stock formatter splits a long default path mid-name,
    which a reader cannot copy and paste back."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(
            " ".join(text.split()), width, break_long_words=False, break_on_hyphens=False
        )


def parse_seeds(text: str) -> list[int]:
    """ "42-51", "42,45,50" or "42"."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            low, sep, high = part.strip().partition("-")
            if sep:
                first, last = int(low), int(high)
                if last < first:
                    raise ValueError
                seeds.extend(range(first, last + 1))
            else:
                seeds.append(int(low))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seeds {text!r}: use a range like 42-51, a list like 42,45 or one seed"
        ) from None
    return seeds


def policy_names(policies: Sequence[Policy]) -> str:
    """The names as --policy takes them ("fragmentation,fgd,..."), for help and errors."""
    return ",".join(p.value for p in policies)


def parse_policies(text: str) -> list[Policy]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return [Policy(n) for n in names] or list(DEFAULT_POLICIES)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"policy {text!r}: choose from {policy_names(list(Policy))}"
        ) from None


def parse_tune(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 10:
        raise argparse.ArgumentTypeError(f"tune {text!r}: use a number in (0, 10], e.g. 1.3")
    return value


def add_trace_arguments(
    parser: argparse.ArgumentParser, pods_help: str, policies: Sequence[Policy]
) -> None:
    """--nodes, --pods and --policy, with their defaults shown resolved: where the default
    trace is depends on where the checkout is."""
    parser.add_argument(
        "--nodes",
        type=Path,
        default=default_path(DEFAULT_NODES),
        help="node list CSV in the openb format (default: %(default)s)",
    )
    parser.add_argument(
        "--pods",
        type=Path,
        default=default_path(DEFAULT_PODS),
        help=f"{pods_help} (default: %(default)s)",
    )
    parser.add_argument(
        "--policy",
        type=parse_policies,
        default=list(policies),
        help=f"comma-separated policies, from {policy_names(list(Policy))} "
        f"(default: {policy_names(policies)})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fracgpu-bench placement",
        formatter_class=PathKeepingHelpFormatter,
        description="Replay an openb-format trace (shared/data/openb/README.md method) through "
        "fracgpu's production placement and report GPU allocation and decision latency.",
    )
    add_trace_arguments(parser, "pod list CSV in the openb format", DEFAULT_POLICIES)
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default=DEFAULT_SEEDS,
        help="seeds of the replays, one replay per policy and seed (the table averages over "
        "them): a range like 42-51, a list like 42,45 or one seed; a seed shuffles the pod "
        "list and draws the clones appended to it (default: %(default)s)",
    )
    parser.add_argument(
        "--tune",
        type=parse_tune,
        default=DEFAULT_TUNE,
        help="how far the pods arriving may overfill the cluster: after the shuffled pod list, "
        "clones of random pods arrive until one more would take the total GPU request past "
        "TUNE x the cluster's GPU capacity; a number in (0, 10] (default: %(default)s)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="replays run in parallel (latency is only comparable with --jobs 1; "
        "default: %(default)s)",
    )
    parser.add_argument(
        "--no-pod-memory",
        action="store_true",
        help="replay with every pod's host memory request set to 0 (compare with the published "
        "figures: the paper's simulator seems not to bind on host memory)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    return parser


def _task(args: tuple[list[TraceNode], list[TracePod], Policy, int, float]) -> SeedResult:
    return replay(*args)


def run(
    nodes: list[TraceNode],
    pods: list[TracePod],
    *,
    policies: Sequence[Policy],
    seeds: Sequence[int],
    tune: float,
    jobs: int,
) -> dict[Policy, list[SeedResult]]:
    tasks = [(nodes, pods, policy, seed, tune) for policy in policies for seed in seeds]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_task, tasks))
    else:
        results = [_task(t) for t in tasks]
    grouped: dict[Policy, list[SeedResult]] = {p: [] for p in policies}
    for result in results:
        grouped[result.policy].append(result)
    return grouped


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.jobs < 1:
        print("fracgpu-bench placement: --jobs must be 1 or more", file=sys.stderr)
        return 2
    nodes_path, pods_path = args.nodes, args.pods
    try:
        nodes = read_nodes(nodes_path)
        pods = read_pods(pods_path)
    except TraceError as e:
        print(f"fracgpu-bench placement: {e}", file=sys.stderr)
        return 2
    if args.no_pod_memory:
        pods = [replace(p, memory_mib=0) for p in pods]
    gpus = capacity_milli(nodes) // 1000
    print(
        f"trace: {nodes_path.name} ({len(nodes)} nodes, {gpus} GPUs), {pods_path.name} "
        f"({len(pods)} pods{', memory 0' if args.no_pod_memory else ''}); "
        f"seeds {','.join(map(str, args.seeds))}; tune {args.tune}; "
        f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        flush=True,
    )
    started = time.perf_counter()
    grouped = run(
        nodes, pods, policies=args.policy, seeds=args.seeds, tune=args.tune, jobs=args.jobs
    )
    summaries = [summarize(p, grouped[p]) for p in args.policy]
    print(table(summaries))
    for line in ratios(summaries):
        print(line)
    if pods_path.name == DEFAULT_PODS.name and nodes_path.name == DEFAULT_NODES.name:
        for line in published(summaries):
            print(line)
    print(f"total wall time {time.perf_counter() - started:.1f} s")
    if args.json is not None:
        payload = [
            {
                **asdict(s),
                "policy": s.policy.value,
                "alloc": {str(x): asdict(v) for x, v in s.alloc.items()},
            }
            for s in summaries
        ]
        args.json.write_text(json.dumps(payload, indent=2))
    return 0
