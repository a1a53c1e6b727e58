"""The CI performance guard passes on its own baseline and fails on an injected slowdown."""

import json
from pathlib import Path
from typing import Any

import pytest

from bench.guard import cli
from bench.guard.cli import compare, load_baseline
from fracgpu.placement.api import PodDemand, Policy
from fracgpu.placement.view import ClusterView

# Small runs: these test the guard's verdicts, not the machine's speed.
QUICK = ["--repeats", "1", "--admissions", "40", "--budget", "0.01"]
MEASURED = {"admission"} | {
    f"placement/{name}" for name in [*cli.workloads.SHAPES, cli.workloads.AFTER_CHURN]
}


def test_passes_on_its_baseline_and_fails_when_a_ratio_regresses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = tmp_path / "baseline.json"
    # A wide tolerance: one quick repeat is noisy, and this run is about the verdict.
    assert cli.main([*QUICK, "--baseline", str(baseline), "--update-baseline",
                     "--tolerance", "3"]) == 0  # fmt: skip
    written = json.loads(baseline.read_text())
    assert written["tolerance"] == 3
    assert set(written["ratios"]) == MEASURED
    assert cli.main([*QUICK, "--baseline", str(baseline)]) == 0
    capsys.readouterr()

    # The same code against a baseline 20x faster than it: as if admission got 20x slower.
    written["ratios"]["admission"] /= 20
    baseline.write_text(json.dumps(written))
    assert cli.main([*QUICK, "--baseline", str(baseline)]) == 1
    err = capsys.readouterr().err
    assert "PERFORMANCE REGRESSION" in err
    assert "admission:" in err and "allowed +300%" in err
    assert "placement/plain:" not in err


def test_compare_names_each_regression_beyond_the_tolerance() -> None:
    baseline = {"a": 1.0, "b": 2.0, "c": 3.0}
    measured = {"a": 1.24, "b": 2.6, "c": 1.0, "d": 5.0}
    problems = compare(measured, baseline, 0.25)
    assert len(problems) == 2
    assert problems[0].startswith("b: 2.60 x reference, baseline 2.00 (+30%, allowed +25%)")
    assert problems[1].startswith("d: not in the baseline")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not JSON"),
        ('{"tolerance": -1, "ratios": {}}', "'tolerance' must be a number"),
        ('{"tolerance": 0.25, "ratios": {"a": "fast"}}', "'ratios' must map names"),
        ("[]", "'tolerance' must be a number"),
        (" " * (cli.MAX_BASELINE_BYTES + 1), "is over"),
    ],
)
def test_a_bad_baseline_is_refused_with_what_is_wrong(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(content)
    with pytest.raises(cli.BaselineError, match=message):
        load_baseline(path)


def test_a_missing_baseline_says_how_to_write_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*QUICK, "--baseline", str(tmp_path / "none.json")]) == 2
    assert "--update-baseline" in capsys.readouterr().err


def test_the_committed_baseline_covers_every_measurement() -> None:
    tolerance, ratios = load_baseline(cli.BASELINE)
    assert tolerance == cli.DEFAULT_TOLERANCE
    assert set(ratios) == MEASURED


def test_fails_when_placement_really_gets_slower(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real slowdown injected into the code it guards: every decision made six times.
    (Three times was once not flagged for multi-gpu on a busy 2-core CI machine: a ratio
    of 1.8 x its baseline can hide in that much noise; 6 x cannot.)"""
    baseline = tmp_path / "baseline.json"
    args = ["--repeats", "2", "--admissions", "40", "--budget", "0.05"]
    assert cli.main([*args, "--baseline", str(baseline), "--update-baseline",
                     "--tolerance", "0.8"]) == 0  # fmt: skip
    place = ClusterView.place

    def slow_place(self: ClusterView, demand: PodDemand, policy: Policy = Policy.BINPACK) -> Any:
        for _ in range(5):
            place(self, demand, policy)
        return place(self, demand, policy)

    monkeypatch.setattr(ClusterView, "place", slow_place)
    capsys.readouterr()
    assert cli.main([*args, "--baseline", str(baseline)]) == 1
    err = capsys.readouterr().err
    assert "placement/plain:" in err and "placement/multi-gpu:" in err
