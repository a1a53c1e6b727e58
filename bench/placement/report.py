"""Aggregating replay results over seeds and printing them side by side."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.placement.replay import SeedResult
from fracgpu.placement import Policy

REPORTED_X = (100, 130)
# The FGD paper's simulator on the default openb trace (shared/data/openb/README.md): GPU
# allocation % at x = 100, mean over 10 seeds. Printed beside our own runs of the same policy.
PUBLISHED_AT_100 = {Policy.FGD: 95.23, Policy.BEST_FIT: 92.86}


@dataclass(frozen=True)
class Stat:
    mean: float
    sd: float  # sample standard deviation over seeds (0 for one seed)

    def __str__(self) -> str:
        if math.isnan(self.mean):
            return "n/a"
        return f"{self.mean:.2f} ± {self.sd:.2f}"


@dataclass(frozen=True)
class PolicySummary:
    policy: Policy
    seeds: int
    alloc: dict[int, Stat]  # x -> allocation % at x
    cpu_at_100: Stat  # % of the nodes' CPU held by placed pods at x = 100
    refused_gpu_less_per_seed: float  # pods without GPUs that found no node
    first_failure: Stat  # arrived % at the first failed pod (seeds without one count as nan)
    first_big_failure: Stat  # arrived % at the first refused whole-node pod (same rule)
    big_never_refused: int  # seeds in which no whole-node pod was refused for lack of room
    # The same over every seed, one that never refused counted at the end of its run: a mean over
    # the refusing seeds alone leaves out the best seeds, and one policy's refusing seeds are not
    # the other's (restricted mean, as for survival times censored at the end of a study).
    big_refusal_or_end: Stat
    latency_p50_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    cpu_p50_ms: float
    cpu_p99_ms: float
    pods_per_seed: float
    placed_per_seed: float
    wall_s: float


def stat(values: Sequence[float]) -> Stat:
    clean = [v for v in values if not math.isnan(v)]
    if not clean:
        return Stat(math.nan, math.nan)
    sd = float(np.std(clean, ddof=1)) if len(clean) > 1 else 0.0
    return Stat(float(np.mean(clean)), sd)


def summarize(policy: Policy, results: Sequence[SeedResult]) -> PolicySummary:
    latencies = np.concatenate([r.latencies_ns for r in results]) / 1e6
    cpu = np.concatenate([r.cpu_ns for r in results]) / 1e6
    return PolicySummary(
        policy=policy,
        seeds=len(results),
        alloc={x: stat([r.alloc_at(x) for r in results]) for x in REPORTED_X},
        cpu_at_100=stat([r.cpu_at(100) for r in results]),
        refused_gpu_less_per_seed=float(np.mean([r.refused_gpu_less for r in results])),
        first_failure=stat(
            [
                math.nan if r.first_failure_arrived is None else r.first_failure_arrived
                for r in results
            ]
        ),
        first_big_failure=stat(
            [
                math.nan if r.first_big_failure_arrived is None else r.first_big_failure_arrived
                for r in results
            ]
        ),
        big_never_refused=sum(1 for r in results if r.first_big_failure_arrived is None),
        big_refusal_or_end=stat([big_refusal_or_end(r) for r in results]),
        latency_p50_ms=float(np.percentile(latencies, 50)),
        latency_p99_ms=float(np.percentile(latencies, 99)),
        latency_max_ms=float(latencies.max()),
        cpu_p50_ms=float(np.percentile(cpu, 50)),
        cpu_p99_ms=float(np.percentile(cpu, 99)),
        pods_per_seed=float(np.mean([r.pods for r in results])),
        placed_per_seed=float(np.mean([r.placed for r in results])),
        wall_s=sum(r.wall_s for r in results),
    )


def big_refusal_or_end(result: SeedResult) -> float:
    """Arrived % at the first whole-node refusal, or at the end of the run if none."""
    first = result.first_big_failure_arrived
    return result.arrived_at_end if first is None else first


def table(summaries: Sequence[PolicySummary]) -> str:
    header = (
        "policy",
        "alloc % x=100",
        "alloc % x=130",
        "arrived % at 1st failure",
        "at 1st 8-GPU refusal",
        "8-GPU refusal, never=end",
        "CPU % x=100",
        "GPU-less refused",
        "p50 ms",
        "p99 ms",
        "max ms",
        "CPU p50/p99 ms",
        "placed/pods",
        "wall s",
    )
    rows = [
        (
            s.policy.value,
            str(s.alloc[100]),
            str(s.alloc[130]),
            str(s.first_failure),
            _big(s),
            str(s.big_refusal_or_end),
            str(s.cpu_at_100),
            f"{s.refused_gpu_less_per_seed:.0f}",
            f"{s.latency_p50_ms:.3f}",
            f"{s.latency_p99_ms:.3f}",
            f"{s.latency_max_ms:.1f}",
            f"{s.cpu_p50_ms:.3f}/{s.cpu_p99_ms:.3f}",
            f"{s.placed_per_seed:.0f}/{s.pods_per_seed:.0f}",
            f"{s.wall_s:.1f}",
        )
        for s in summaries
    ]
    return text_table(header, rows)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, a dashed rule under the header."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _big(s: PolicySummary) -> str:
    """The first whole-node refusal; seeds that never refused one are counted beside it."""
    if s.big_never_refused == 0:
        return str(s.first_big_failure)
    if s.big_never_refused == s.seeds:
        return "never"
    return f"{s.first_big_failure} ({s.big_never_refused} never)"


def published(summaries: Sequence[PolicySummary]) -> list[str]:
    """Our runs of the policies the FGD paper also ran, beside its published figure (only
    meaningful on the default openb trace)."""
    lines = []
    for s in summaries:
        ref = PUBLISHED_AT_100.get(s.policy)
        if ref is not None:
            got = s.alloc[100].mean
            lines.append(
                f"{s.policy.value}: {got:.2f} % at x=100 vs {ref:.2f} % published on the "
                f"default openb trace ({got - ref:+.2f} points)"
            )
    return lines


def ratios(summaries: Sequence[PolicySummary], baseline: Policy = Policy.BEST_FIT) -> list[str]:
    """Unallocated GPU at x=100 relative to the baseline: how much less capacity is wasted."""
    base = next((s for s in summaries if s.policy is baseline), None)
    if base is None:
        return []
    lines = []
    wasted_base = 100 - base.alloc[100].mean
    for s in summaries:
        if s is base or wasted_base <= 0:
            continue
        wasted = 100 - s.alloc[100].mean
        lines.append(
            f"{s.policy.value}: {s.alloc[100].mean - base.alloc[100].mean:+.2f} points of GPU "
            f"allocated at x=100 vs {baseline.value}; unallocated GPU "
            f"{wasted:.2f} % vs {wasted_base:.2f} % (ratio {wasted / wasted_base:.2f})"
        )
    return lines
