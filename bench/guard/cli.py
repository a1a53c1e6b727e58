"""``fracgpu-bench guard``: fail CI when admission or placement got slower than the baseline.

Each measurement (CPU time per admission; CPU time per placement decision for each pod shape
in ``workloads.SHAPES``, and per node churn plus the constrained decision after it) is
divided by the CPU time of a fixed pure-Python reference loop timed in the same run, so the
machine's speed cancels out. Every measurement is taken
REPEATS times, interleaved with the reference, and the fastest kept (CPU time only ever
grows with interference). A ratio more than the baseline's tolerance (25 %) above the
committed baseline (``bench/guard/baseline.json``), in this run and again in a second run
made to confirm it, fails the guard; ``--update-baseline``
rewrites the file from this run. Run it on an idle machine when updating.
"""

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.guard import workloads

BASELINE = Path(__file__).with_name("baseline.json")
DEFAULT_TOLERANCE = 0.25
REFERENCE_ROUNDS = 200
# Bounds on a baseline file read from disk: it is input like any other.
MAX_BASELINE_BYTES = 64 * 1024


class BaselineError(ValueError):
    """The baseline file is missing or malformed; the message says what and how to fix it."""


def measure(repeats: int, admissions: int, budget: float) -> dict[str, float]:
    """Ratio of each measurement to the reference loop, fastest of ``repeats`` each."""
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(seconds, best.get(name, seconds))

    view = workloads.placement_view()
    with tempfile.TemporaryDirectory(prefix="fracgpu-guard-") as tmp:
        cluster = Path(tmp) / "cluster.yaml"
        workloads.write_cluster(cluster, 100, 8)
        for _ in range(repeats):
            keep("reference", workloads.reference(REFERENCE_ROUNDS))
            keep("admission", workloads.admission(cluster, admissions // 4, admissions))
            for shape in workloads.SHAPES:
                keep(f"placement/{shape}", workloads.placement(view, shape, budget))
            keep(f"placement/{workloads.AFTER_CHURN}", workloads.placement_after_churn())
    reference = best.pop("reference")
    return {name: seconds / reference for name, seconds in best.items()}


def load_baseline(path: Path) -> tuple[float, dict[str, float]]:
    """(tolerance, ratios) from a baseline file, validated."""
    try:
        raw = path.read_bytes()[: MAX_BASELINE_BYTES + 1]
    except OSError as error:
        raise BaselineError(
            f"cannot read the baseline {path}: {error.strerror}; "
            "write one with `fracgpu-bench guard --update-baseline`"
        ) from None
    if len(raw) > MAX_BASELINE_BYTES:
        raise BaselineError(f"baseline {path} is over {MAX_BASELINE_BYTES} bytes")
    try:
        data: Any = json.loads(raw)
    except ValueError as error:
        raise BaselineError(f"baseline {path} is not JSON: {error}") from None
    tolerance = data.get("tolerance") if isinstance(data, dict) else None
    ratios = data.get("ratios") if isinstance(data, dict) else None
    if not isinstance(tolerance, (int, float)) or not 0 < tolerance <= 10:
        raise BaselineError(f"baseline {path}: 'tolerance' must be a number in (0, 10]")
    if not isinstance(ratios, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and v > 0 for k, v in ratios.items()
    ):
        raise BaselineError(f"baseline {path}: 'ratios' must map names to positive numbers")
    return float(tolerance), {k: float(v) for k, v in ratios.items()}


def compare(measured: dict[str, float], baseline: dict[str, float], tolerance: float) -> list[str]:
    """One line per regression beyond ``tolerance`` or measurement the baseline lacks."""
    problems = []
    for name, ratio in measured.items():
        if name not in baseline:
            problems.append(f"{name}: not in the baseline; run with --update-baseline")
            continue
        limit = baseline[name] * (1 + tolerance)
        if ratio > limit:
            problems.append(
                f"{name}: {ratio:.2f} x reference, baseline {baseline[name]:.2f} "
                f"(+{ratio / baseline[name] - 1:.0%}, allowed +{tolerance:.0%})"
            )
    return problems


def write_baseline(path: Path, ratios: dict[str, float], tolerance: float) -> None:
    document = {
        "about": "fracgpu-bench guard: CPU time per operation / CPU time of the reference "
        "loop, fastest of the repeats; a ratio more than 'tolerance' above its value here "
        "fails CI. Rewrite with `fracgpu-bench guard --update-baseline` on an idle machine.",
        "tolerance": tolerance,
        "measured_on": f"{platform.python_implementation()} {platform.python_version()}, "
        f"{platform.machine()}, {time.strftime('%Y-%m-%d', time.gmtime())}",
        "ratios": {name: round(ratio, 3) for name, ratio in sorted(ratios.items())},
    }
    path.write_text(json.dumps(document, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fracgpu-bench guard", description=__doc__)
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--update-baseline", action="store_true", help="write the baseline")
    parser.add_argument("--tolerance", type=float, help="with --update-baseline (default 0.25)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--admissions", type=int, default=800)
    parser.add_argument(
        "--budget", type=float, default=0.15, help="CPU seconds per placement measurement"
    )
    options = parser.parse_args(argv)
    if min(options.repeats, options.admissions) < 1 or not 0.001 <= options.budget <= 60:
        parser.error("--repeats and --admissions: use 1 or more each; --budget 0.001 to 60")
    if options.tolerance is not None and not 0 < options.tolerance <= 10:
        parser.error("--tolerance: use a fraction in (0, 10], e.g. 0.25 for 25 %")
    if options.tolerance is not None and not options.update_baseline:
        parser.error("--tolerance is stored in the baseline: use it with --update-baseline")
    if not options.update_baseline:
        try:
            tolerance, baseline = load_baseline(options.baseline)
        except BaselineError as error:
            print(f"fracgpu-bench guard: {error}", file=sys.stderr)
            return 2
    started = time.monotonic()
    measured = measure(options.repeats, options.admissions, options.budget)
    for name, ratio in measured.items():
        print(f"{name:<32} {ratio:8.2f} x reference")
    print(f"measured in {time.monotonic() - started:.0f} s")
    if options.update_baseline:
        write_baseline(options.baseline, measured, options.tolerance or DEFAULT_TOLERANCE)
        print(f"wrote {options.baseline}")
        return 0
    problems = compare(measured, baseline, tolerance)
    if problems:
        # Confirm before failing: a regression must show in a second, independent run too
        # (each ratio is the lower of the two), so one burst of machine noise cannot fail CI.
        print("over the tolerance; measuring again to confirm", file=sys.stderr)
        again = measure(options.repeats, options.admissions, options.budget)
        measured = {name: min(ratio, again.get(name, ratio)) for name, ratio in measured.items()}
        problems = compare(measured, baseline, tolerance)
    if problems:
        print("PERFORMANCE REGRESSION (fracgpu-bench guard):", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"no regression beyond +{tolerance:.0%} of {options.baseline}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
