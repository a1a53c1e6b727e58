"""``fracgpu-bench placement-synth``: derive other workloads from an openb pod list.

The FGD paper also evaluates variants of the default trace; these are built the same way
(from the default pods, deterministic for a seed), so the policy can be checked on
workloads it was not tuned on:

- ``sharing``: a larger share of the GPU pods are sharing pods (``--fraction`` of GPU pods),
- ``multi-gpu``: a share of the GPU pods ask for 2, 4 or 8 whole GPUs,
- ``gpu-models``: a share of the GPU pods may only run on one or two GPU models,
- ``cpu-heavy``: CPU-only pods are added until their CPU request is ``--fraction`` x more.

The ``openb-*`` kinds are built the way the published variants of the openb trace are
(alibaba/clusterdata, cluster-trace-gpu-v2023: ``openb_pod_list_cpu250.csv`` and the like),
as read off those files, so the bench can stand in for them without a download:

- ``openb-cpu``: the CPU-only pods, drawn from the list's own, make up ``--fraction`` of the
  pods (``cpu250`` is 0.25); the GPU pods stay as they are.
- ``openb-gpushare``: the GPU pods are drawn again, ``--fraction`` of them from the sharing
  pods and the rest from the other GPU pods (``gpushare80`` is 0.8).
- ``openb-multigpu``: multi-GPU pods drawn from the list's own are added until they ask for
  ``--fraction`` of the GPU request (``multigpu50`` is 0.5).
- ``openb-gpuspec``: ``--fraction`` of the GPU pods are limited to GPU models, each to a set
  drawn by how often production pods asked for it (``GPUSPEC_FREQUENCY``; ``gpuspec33`` is
  0.33, and its pods are limited the same way).
"""

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.placement.cli import DEFAULT_NODES, DEFAULT_PODS, default_path
from bench.placement.trace import (
    MILLI_PER_GPU,
    TraceError,
    TraceNode,
    TracePod,
    read_nodes,
    read_pods,
    write_pods,
)

KINDS = (
    "sharing",
    "multi-gpu",
    "gpu-models",
    "cpu-heavy",
    "openb-cpu",
    "openb-gpushare",
    "openb-multigpu",
    "openb-gpuspec",
)
_MULTI_GPU_COUNTS = (2, 4, 8)
# The model sets the 2,388 limited pods of openb_pod_list_gpuspec33.csv ask for, and how many
# ask for each (the trace's production constraints: T4 is 13.5 % of the cluster's GPUs but
# more than half of these pods want it).
GPUSPEC_FREQUENCY: tuple[tuple[tuple[str, ...], int], ...] = (
    (("T4",), 1291),
    (("G2",), 331),
    (("P100",), 279),
    (("V100M16", "V100M32"), 163),
    (("P100", "V100M16", "V100M32"), 103),
    (("G3",), 86),
    (("G2", "P100", "T4", "V100M16", "V100M32"), 39),
    (("P100", "T4", "V100M16", "V100M32"), 33),
    (("A10", "G2", "T4", "V100M16", "V100M32"), 24),
    (("V100M32",), 20),
    (("A10", "T4"), 6),
    (("P100", "V100M16"), 4),
    (("A10", "G2", "P100", "T4", "V100M16", "V100M32"), 3),
    (("T4", "V100M16", "V100M32"), 3),
    (("V100M16",), 3),
)


def synthesize(
    kind: str, pods: Sequence[TracePod], nodes: Sequence[TraceNode], fraction: float, seed: int
) -> list[TracePod]:
    rng = np.random.default_rng(seed)
    out = list(pods)
    gpu_pods = [i for i, p in enumerate(out) if p.num_gpu > 0]
    if kind == "sharing":
        donors = [p for p in out if 0 < p.gpu_milli < MILLI_PER_GPU]
        whole = [i for i in gpu_pods if out[i].gpu_milli == MILLI_PER_GPU]
        target = int(fraction * len(gpu_pods)) - len(donors)
        for i in _pick(rng, whole, target):
            donor = donors[int(rng.integers(len(donors)))]
            out[i] = replace(donor, name=out[i].name)
    elif kind == "multi-gpu":
        singles = [i for i in gpu_pods if out[i].num_gpu == 1]
        for i in _pick(rng, singles, int(fraction * len(gpu_pods))):
            count = int(rng.choice(_MULTI_GPU_COUNTS))
            out[i] = replace(
                out[i], num_gpu=count, gpu_milli=MILLI_PER_GPU, cpu_milli=out[i].cpu_milli * count
            )
    elif kind == "gpu-models":
        models, counts = np.unique(
            [n.model for n in nodes for _ in range(n.gpus)], return_counts=True
        )
        weights = counts / counts.sum()
        for i in _pick(rng, gpu_pods, int(fraction * len(gpu_pods))):
            k = 1 + int(rng.integers(2))
            chosen = rng.choice(models, size=min(k, len(models)), replace=False, p=weights)
            out[i] = replace(out[i], gpu_spec=tuple(sorted(str(m) for m in chosen)))
    elif kind.startswith("openb-"):
        out = _openb_variant(kind, out, fraction, rng)
    elif kind == "cpu-heavy":
        cpu_only = [p for p in out if p.num_gpu == 0]
        if not cpu_only:
            raise TraceError("cpu-heavy needs CPU-only pods in the source pod list")
        extra = fraction * sum(p.cpu_milli for p in cpu_only)
        added = 0
        while extra > 0:
            donor = cpu_only[int(rng.integers(len(cpu_only)))]
            out.append(replace(donor, name=f"{donor.name}-cpu{added}"))
            extra -= donor.cpu_milli
            added += 1
    else:
        raise TraceError(f"unknown kind {kind!r}: choose from {', '.join(KINDS)}")
    return out


# An openb-* kind writes at most this many times the source list's pods: the count grows as
# 1 / (1 - fraction), and a fraction just below 1 would otherwise fill memory.
MAX_GROWTH = 10


def _openb_variant(
    kind: str, pods: list[TracePod], fraction: float, rng: np.random.Generator
) -> list[TracePod]:
    if fraction > 1 or (fraction == 1 and kind in ("openb-cpu", "openb-multigpu")):
        allowed = "[0, 1)" if kind in ("openb-cpu", "openb-multigpu") else "[0, 1]"
        raise TraceError(f"{kind}: --fraction {fraction} is a share: use a number in {allowed}")
    cpu_only = [p for p in pods if p.num_gpu == 0]
    gpu = [p for p in pods if p.num_gpu > 0]
    if not gpu:
        raise TraceError(f"{kind} needs GPU pods in the source pod list; it has none")
    limit = MAX_GROWTH * len(pods)
    if kind == "openb-cpu":
        if not cpu_only:
            raise TraceError("openb-cpu needs CPU-only pods in the source pod list; it has none")
        count = round(fraction / (1 - fraction) * len(gpu))
        if count + len(gpu) > limit:
            raise TraceError(
                f"openb-cpu: --fraction {fraction} would write {count + len(gpu)} pods, more "
                f"than {MAX_GROWTH} x the {len(pods)} of the source list: use a smaller share"
            )
        return _renamed(_draw(rng, cpu_only, count) + gpu)
    if kind == "openb-gpushare":
        sharing = [p for p in gpu if _is_sharing(p)]
        other = [p for p in gpu if not _is_sharing(p)]
        want = round(fraction * len(gpu))
        if want and not sharing:
            raise TraceError("openb-gpushare needs sharing pods in the source pod list to draw")
        if want < len(gpu) and not other:
            raise TraceError(
                "openb-gpushare needs whole-GPU or multi-GPU pods in the source pod list to draw"
            )
        drawn = _draw(rng, sharing, want) + _draw(rng, other, len(gpu) - want)
        order = rng.permutation(len(drawn))
        return _renamed(cpu_only + [drawn[int(i)] for i in order])
    if kind == "openb-multigpu":
        multi = [p for p in gpu if p.num_gpu > 1 and p.gpu_request > 0]
        if not multi:
            raise TraceError("openb-multigpu needs multi-GPU pods in the source pod list")
        total = sum(p.gpu_request for p in gpu)
        wide = sum(p.gpu_request for p in multi)
        out = list(pods)
        while wide < fraction * total:
            if len(out) >= limit:
                raise TraceError(
                    f"openb-multigpu: --fraction {fraction} needs more than {MAX_GROWTH} x the "
                    f"{len(pods)} pods of the source list: use a smaller share"
                )
            added = multi[int(rng.integers(len(multi)))]
            out.append(added)
            wide += added.gpu_request
            total += added.gpu_request
        return _renamed(out)
    if kind == "openb-gpuspec":
        sets = [models for models, _ in GPUSPEC_FREQUENCY]
        weights = np.array([count for _, count in GPUSPEC_FREQUENCY], dtype=np.float64)
        indices = [i for i, p in enumerate(pods) if p.num_gpu > 0]
        out = list(pods)
        for i in _pick(rng, indices, round(fraction * len(indices))):
            chosen = sets[int(rng.choice(len(sets), p=weights / weights.sum()))]
            out[i] = replace(out[i], gpu_spec=chosen)
        return out
    raise TraceError(f"unknown kind {kind!r}: choose from {', '.join(KINDS)}")


def _is_sharing(pod: TracePod) -> bool:
    return pod.num_gpu == 1 and pod.gpu_milli < MILLI_PER_GPU


def _draw(rng: np.random.Generator, pods: Sequence[TracePod], count: int) -> list[TracePod]:
    """``count`` pods drawn from ``pods`` with replacement."""
    return [pods[int(i)] for i in rng.integers(len(pods), size=count)] if count > 0 else []


def _renamed(pods: Sequence[TracePod]) -> list[TracePod]:
    """Names made unique again after drawing (one pod may be drawn many times)."""
    return [replace(p, name=f"openb-pod-{i:04d}") for i, p in enumerate(pods)]


def _pick(rng: np.random.Generator, indices: Sequence[int], count: int) -> list[int]:
    count = max(0, min(count, len(indices)))
    return [
        int(i) for i in rng.choice(np.asarray(indices, dtype=np.int64), size=count, replace=False)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fracgpu-bench placement-synth",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]).replace("``", "'"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--fraction", type=float, required=True, help="see the kind's description")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nodes", type=Path, default=None)
    parser.add_argument("--pods", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True, help="pod list CSV to write")
    args = parser.parse_args(argv)
    if not 0 <= args.fraction <= 10:
        print("fracgpu-bench placement-synth: --fraction must be in [0, 10]", file=sys.stderr)
        return 2
    try:
        nodes = read_nodes(args.nodes or default_path(DEFAULT_NODES))
        pods = read_pods(args.pods or default_path(DEFAULT_PODS))
        write_pods(args.out, synthesize(args.kind, pods, nodes, args.fraction, args.seed))
    except (TraceError, OSError) as e:
        print(f"fracgpu-bench placement-synth: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0
