"""libFuzzer on the shim's limits-file parser (shim/fuzz/limits_fuzz.c).

CI runs a fixed number of inputs; FRACGPU_FUZZ_SECONDS=<n> runs for n seconds instead.
The harness aborts on any broken invariant of docs/shim.md, and ASan/UBSan on any
memory or undefined-behaviour error, so exit status 0 means no input crashed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.shim.sandbox import BUILD, SHIM_DIR

CI_RUNS = 200_000
FUZZ_DIR = SHIM_DIR / "fuzz"
CORPUS = FUZZ_DIR / "corpus"
DICTIONARY = FUZZ_DIR / "limits.dict"
_EXECUTED = re.compile(r"stat::number_of_executed_units:\s*(\d+)")


def _long_run_seconds(env: Mapping[str, str]) -> int | None:
    raw = env.get("FRACGPU_FUZZ_SECONDS")
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"FRACGPU_FUZZ_SECONDS={raw!r}: a whole number of seconds >= 1 is allowed")
    return int(raw)


LONG_RUN_SECONDS = _long_run_seconds(os.environ)


def _build(build_dir: Path, limits_src: Path | None = None) -> Path:
    if shutil.which("clang") is None:
        reason = (
            "clang is not installed "
            "(scripts/install-system-deps.sh installs clang and libclang-rt-14-dev)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must fuzz the shim's limits parser: {reason}")
        pytest.skip(reason)
    args = ["make", "-s", "-C", str(SHIM_DIR), "fuzz", f"BUILD={build_dir}"]
    if limits_src is not None:
        args.append(f"FUZZ_LIMITS_SRC={limits_src}")
    made = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert made.returncode == 0, f"make -C shim fuzz failed:\n{made.stdout}\n{made.stderr}"
    return build_dir / "fuzz" / "limits_fuzz"


def _fuzz(binary: Path, work: Path, budget: list[str]) -> subprocess.CompletedProcess[str]:
    """Run libFuzzer; new inputs go to work/corpus, never into the seed corpus."""
    (work / "corpus").mkdir(exist_ok=True)
    return subprocess.run(
        [
            str(binary),
            f"-dict={DICTIONARY}",
            f"-artifact_prefix={work}/",
            "-print_final_stats=1",
            "-timeout=10",
            "-rss_limit_mb=2048",
            *budget,
            str(work / "corpus"),
            str(CORPUS),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=(LONG_RUN_SECONDS or 0) + 240,
        check=False,
    )


def _inputs_tried(output: str) -> int:
    found = _EXECUTED.search(output)
    assert found, f"no libFuzzer final stats in the output:\n{output[-3000:]}"
    return int(found.group(1))


@pytest.mark.timeout((LONG_RUN_SECONDS or 0) + 300)
def test_limits_parser_survives_libfuzzer(tmp_path: Path) -> None:
    binary = _build(BUILD)
    if LONG_RUN_SECONDS is None:
        budget = [f"-runs={CI_RUNS}"]
    else:
        budget = [f"-max_total_time={LONG_RUN_SECONDS}"]
    out = _fuzz(binary, tmp_path, budget)
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name != "corpus")
    assert out.returncode == 0, f"libFuzzer found a crash {crashes}:\n{out.stderr[-6000:]}"
    assert crashes == []
    tried = _inputs_tried(out.stderr)
    if LONG_RUN_SECONDS is None:
        assert tried >= CI_RUNS
    print(f"\nlimits_fuzz: {tried} inputs tried ({' '.join(budget)}), no crash")


MUTANTS = {
    # An accepted core_limit of 101 breaks the harness's docs/shim.md invariant.
    "core_limit_101": ("v < 1 || v > 100)", "v < 1 || v > 101)", "invariant broken"),
    # A line buffer too small for a 1024-byte line is an ASan stack overflow.
    "short_line_buffer": (
        "char buf[FRACGPU_LIMITS_MAX_LINE + 1];",
        "char buf[256];",
        "AddressSanitizer: stack-buffer-overflow",
    ),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_harness_and_seed_corpus_catch_a_broken_parser(tmp_path: Path, mutant: str) -> None:
    old, new, expected = MUTANTS[mutant]
    source = (SHIM_DIR / "src" / "limits.c").read_text()
    assert old in source, f"mutant {mutant}: {old!r} is no longer in src/limits.c"
    broken = tmp_path / "limits_mutant.c"
    broken.write_text(source.replace(old, new, 1))
    binary = _build(tmp_path / "build", broken)
    out = _fuzz(binary, tmp_path, ["-runs=0"])  # replay the seed corpus only
    assert out.returncode != 0, f"mutant {mutant} survived the seed corpus:\n{out.stderr[-3000:]}"
    assert expected in out.stderr
