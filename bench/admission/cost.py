"""``fracgpu-bench admission-cost``: what one admission costs in process, without HTTP.

The bench's pod (one TKEStack container, 10 cores, 4 blocks) is parsed from its review bytes,
admitted by ``Admission.mutate`` on the embedded back end (NODES x GPUS, really reserved)
and its answer encoded, ADMISSIONS times after a warm-up. Printed: CPU time per admission
and, when valgrind is installed, instructions per admission counted by callgrind. Wall and
CPU time on a shared virtual machine drift by tens of percent between runs; the instruction
count does not (to within a tenth of a percent), so it compares two trees exactly.
"""

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from bench.admission.cli import _cluster_file, _review
from webhook import settings
from webhook.admission import responses
from webhook.admission.decide import Admission
from webhook.admission.review import parse_review
from webhook.metrics import Metrics
from webhook.state.embedded import EmbeddedState

# Set in the child that runs under callgrind: switch counting on and off around the loop.
_UNDER_CALLGRIND = "FRACGPU_BENCH_UNDER_CALLGRIND"


def admit_all(cluster: Path, warmup: int, admissions: int, count_instructions: bool) -> float:
    """Seconds of CPU per admission over ``admissions`` admissions, after a warm-up."""
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    config = settings.load(parser.parse_args(["--cluster-file", str(cluster)]), {})
    state = EmbeddedState.from_file(
        cluster, config.split_count, config.reservation_ttl_seconds, config.memory_scaling
    )
    admission = Admission(config, state, Metrics())
    bodies = [orjson.dumps(_review(i)) for i in range(warmup + admissions)]

    async def admit(batch: list[bytes]) -> None:
        for body in batch:
            review = parse_review(body, "application/json", config.max_body_bytes)
            verdict = await admission.mutate(review)
            if not verdict.patch:
                raise RuntimeError(f"the bench's pod was not placed: {verdict.message}")
            orjson.dumps(responses.to_review(review.uid, verdict))

    asyncio.run(admit(bodies[:warmup]))
    _callgrind("on", count_instructions)
    started = time.process_time()
    asyncio.run(admit(bodies[warmup:]))
    used = time.process_time() - started
    _callgrind("off", count_instructions)
    return used / admissions


def _callgrind(switch: str, count_instructions: bool) -> None:
    if count_instructions:
        subprocess.run(
            ["callgrind_control", "-i", switch, str(os.getpid())], check=True, capture_output=True
        )


def _instructions(cluster: Path, warmup: int, admissions: int, work: Path) -> int:
    """Instructions per admission: this module again, under callgrind, counting the loop only."""
    log = work / "callgrind.log"
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         f"--callgrind-out-file={work / 'callgrind.out'}", f"--log-file={log}",
         sys.executable, "-m", "bench.admission.cost", "--cluster", str(cluster),
         "--warmup", str(warmup), "--admissions", str(admissions)],
        check=True, env={**os.environ, _UNDER_CALLGRIND: "1"}, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    for line in log.read_text().splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1].replace(",", "").strip()) // admissions
    raise RuntimeError(f"callgrind wrote no count to {log}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fracgpu-bench admission-cost", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1000, help="untimed admissions first")
    parser.add_argument("--admissions", type=int, default=5000)
    parser.add_argument("--cluster", type=Path, help=argparse.SUPPRESS)  # the callgrind child
    options = parser.parse_args(argv)
    if min(options.nodes, options.gpus, options.admissions) < 1 or options.warmup < 0:
        parser.error("--nodes, --gpus and --admissions: use 1 or more each; --warmup 0 or more")
    if os.environ.get(_UNDER_CALLGRIND):
        admit_all(options.cluster, options.warmup, options.admissions, count_instructions=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="fracgpu-bench-") as tmp:
        work = Path(tmp)
        cluster = work / "cluster.yaml"
        _cluster_file(cluster, options.nodes, options.gpus)
        cpu = admit_all(cluster, options.warmup, options.admissions, count_instructions=False)
        print(f"CPU per admission: {cpu * 1e6:.1f} us ({options.admissions} admissions)")
        if shutil.which("valgrind") is None:
            print("instructions per admission: valgrind is not installed, not counted")
            return 0
        # Under callgrind everything runs ~50x slower: count a tenth of the admissions.
        counted = max(1, options.admissions // 10)
        print(
            f"instructions per admission: "
            f"{_instructions(cluster, options.warmup, counted, work):,} "
            f"(callgrind, {counted} admissions)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
