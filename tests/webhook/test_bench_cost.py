"""fracgpu-bench admission-cost on a tiny cluster: it admits, counts, and refuses bad input."""

import re
import shutil

import pytest

from bench.cli import main as bench_main

TINY = ["--nodes", "2", "--gpus", "2", "--warmup", "5", "--admissions", "20"]


def test_cpu_per_admission_without_valgrind(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _: None)
    assert bench_main(["admission-cost", *TINY]) == 0
    out = capsys.readouterr().out
    cpu = re.search(r"CPU per admission: ([0-9.]+) us \(20 admissions\)", out)
    assert cpu is not None and float(cpu.group(1)) > 0
    assert "valgrind is not installed, not counted" in out


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_instructions_per_admission_under_callgrind(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["admission-cost", *TINY]) == 0
    found = re.search(
        r"instructions per admission: ([0-9,]+) \(callgrind, 2 admissions\)",
        capsys.readouterr().out,
    )
    assert found is not None
    # An admission is hundreds of thousands of instructions; a count of zero or a handful
    # would mean callgrind counted nothing of the loop.
    assert int(found.group(1).replace(",", "")) > 10_000


def test_more_admissions_than_the_cluster_holds_is_an_error() -> None:
    # 2 GPUs x 10 slices of the bench's pod: the 21st cannot be placed.
    with pytest.raises(RuntimeError, match="the bench's pod was not placed"):
        bench_main(
            ["admission-cost", "--nodes", "1", "--gpus", "2", "--warmup", "0", "--admissions", "21"]
        )


def test_bad_counts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_main(["admission-cost", "--admissions", "0"])
    assert "use 1 or more each" in capsys.readouterr().err
