"""libFuzzer on the shim's parsers of files it reads: the limits file
(shim/fuzz/limits_fuzz.c) and a GPU's node board (shim/fuzz/board_fuzz.c: truncated,
torn, garbage and forged boards).

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


def _build(build_dir: Path, limits_src: Path | None = None, board_src: Path | None = None) -> Path:
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
    if board_src is not None:
        args.append(f"FUZZ_BOARD_SRC={board_src}")
    made = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert made.returncode == 0, f"make -C shim fuzz failed:\n{made.stdout}\n{made.stderr}"
    return build_dir / "fuzz" / "limits_fuzz"


def _fuzz(
    binary: Path, work: Path, budget: list[str], seeds: Path = CORPUS, dictionary: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run libFuzzer; new inputs go to work/corpus, never into the seed corpus."""
    (work / "corpus").mkdir(exist_ok=True)
    return subprocess.run(
        [
            str(binary),
            *([f"-dict={DICTIONARY}"] if dictionary else []),
            f"-artifact_prefix={work}/",
            "-print_final_stats=1",
            "-timeout=10",
            "-rss_limit_mb=2048",
            *budget,
            str(work / "corpus"),
            str(seeds),
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


# ---- the node board parser ----

BOARD_CORPUS = FUZZ_DIR / "board_corpus"


@pytest.mark.timeout((LONG_RUN_SECONDS or 0) + 300)
def test_board_parser_survives_libfuzzer(tmp_path: Path) -> None:
    """Whatever bytes a board holds (a short read, a torn write, garbage, stamps and counts
    at their maximum), the parser reads none past them and every value it returns is
    bounded: a wait ends at most a hold after publication, nobody is seen after it."""
    binary = _build(BUILD).with_name("board_fuzz")
    budget = (
        [f"-runs={CI_RUNS}"]
        if LONG_RUN_SECONDS is None
        else [f"-max_total_time={LONG_RUN_SECONDS}"]
    )
    out = _fuzz(binary, tmp_path, budget, seeds=BOARD_CORPUS, dictionary=False)
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name != "corpus")
    assert out.returncode == 0, f"libFuzzer found a crash {crashes}:\n{out.stderr[-6000:]}"
    assert crashes == []
    tried = _inputs_tried(out.stderr)
    if LONG_RUN_SECONDS is None:
        assert tried >= CI_RUNS
    print(f"\nboard_fuzz: {tried} inputs tried ({' '.join(budget)}), no crash")


BOARD_MUTANTS = {
    # Without the length check a truncated board is read past its end.
    "no_length_check": (
        "len < FRACGPU_BOARD_READ_SIZE)",
        "len < 16)",
        "AddressSanitizer: heap-buffer-overflow",
    ),
    # Without the clamp a forged stamp holds a best-effort container forever.
    "no_stamp_clamp": (
        "high = sat_add(published, FRACGPU_BOARD_HIGH_HOLD_NS);",
        "(void)0;",
        "invariant broken",
    ),
    # Trusting the entry count reads entries past the board.
    "no_count_check": (
        "if (count > FRACGPU_BOARD_MAX_ENTRIES)\n        return -1;",
        "",
        "AddressSanitizer: heap-buffer-overflow",
    ),
}


@pytest.mark.parametrize("mutant", sorted(BOARD_MUTANTS))
def test_board_harness_and_seeds_catch_a_broken_parser(tmp_path: Path, mutant: str) -> None:
    old, new, expected = BOARD_MUTANTS[mutant]
    source = (SHIM_DIR / "src" / "board_parse.c").read_text()
    assert old in source, f"mutant {mutant}: {old!r} is no longer in src/board_parse.c"
    broken = tmp_path / "board_mutant.c"
    broken.write_text(source.replace(old, new, 1))
    binary = _build(tmp_path / "build", board_src=broken).with_name("board_fuzz")
    out = _fuzz(binary, tmp_path, ["-runs=0"], seeds=BOARD_CORPUS, dictionary=False)
    assert out.returncode != 0, f"mutant {mutant} survived the seed corpus:\n{out.stderr[-3000:]}"
    assert expected in out.stderr
