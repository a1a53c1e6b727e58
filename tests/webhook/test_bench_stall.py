"""fracgpu-bench admission-stall on a tiny setting: it runs, every large pod is answered as
the limits say (denied naming a limit, or admitted when within them), and it prints the
ratio it exists for."""

import re

import pytest

from bench.cli import main as bench_main

TINY = [
    "--nodes", "2", "--gpus", "2", "--seconds", "1", "--rounds", "1",
    "--workers", "1", "--attackers", "1", "--large-bytes", "200000",
]  # fmt: skip


def test_the_bench_runs_on_a_tiny_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["admission-stall", *TINY]) == 0  # 1 would mean a wrong answer
    out = capsys.readouterr().out
    ratio = re.search(r"p99 without them = ([0-9.]+) \(target <= 2\)", out)
    assert ratio is not None and float(ratio.group(1)) > 0, out
    large = re.search(r"\| large pods \(~0\.[23] MB each\) \| (\d+) \|", out)
    assert large is not None and int(large.group(1)) > 0, out


def test_bad_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_main(["admission-stall", "--attackers", "0"])
    assert "use 1 or more" in capsys.readouterr().err
