"""``fracgpu-bench placement-synth``: derive other workloads from an openb pod list.

The FGD paper also evaluates variants of the default trace; these are built the same way
(from the default pods, deterministic for a seed), so the policy can be checked on
workloads it was not tuned on:

- ``sharing``: a larger share of the GPU pods are sharing pods (``--fraction`` of GPU pods),
- ``multi-gpu``: a share of the GPU pods ask for 2, 4 or 8 whole GPUs,
- ``gpu-models``: a share of the GPU pods may only run on one or two GPU models,
- ``cpu-heavy``: CPU-only pods are added until their CPU request is ``--fraction`` x more.
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

KINDS = ("sharing", "multi-gpu", "gpu-models", "cpu-heavy")
_MULTI_GPU_COUNTS = (2, 4, 8)


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


def _pick(rng: np.random.Generator, indices: Sequence[int], count: int) -> list[int]:
    count = max(0, min(count, len(indices)))
    return [
        int(i) for i in rng.choice(np.asarray(indices, dtype=np.int64), size=count, replace=False)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fracgpu-bench placement-synth", description=__doc__.split("\n\n")[0]
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
