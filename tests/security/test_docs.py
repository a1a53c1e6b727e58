"""docs/security.md cannot go stale: its claims are numbered 1..N, each cites at least one
test, and every cited test id is one pytest collects today."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "security.md"
# A claim starts at the left margin with "N. "; indented lines continue it.
_CLAIM = re.compile(r"^(\d+)\. (.*(?:\n {3,}.*)*)", re.MULTILINE)
_TEST_ID = re.compile(r"`(tests/[\w/]+\.py::\w+(?:\[[^\]`]+\])?)`")


def claims(text: str) -> dict[int, str]:
    found: dict[int, str] = {}
    for match in _CLAIM.finditer(text):
        number = int(match.group(1))
        assert number not in found, f"claim {number} appears twice"
        found[number] = match.group(2)
    return found


def cited(claim: str) -> list[str]:
    return _TEST_ID.findall(claim)


def collected(files: set[str]) -> set[str]:
    """Node ids pytest collects from ``files`` (one subprocess, no test runs)."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    ids = {line.strip() for line in result.stdout.splitlines() if "::" in line}
    assert ids, f"nothing collected from {sorted(files)}:\n{result.stdout}\n{result.stderr}"
    return ids


def unknown(test_ids: list[str], known: set[str]) -> list[str]:
    """Cited ids no collected test matches (a function id matches all its parameters)."""
    return [
        test_id
        for test_id in test_ids
        if test_id not in known and not any(k.startswith(test_id + "[") for k in known)
    ]


def test_claims_are_numbered_in_order_and_each_cites_a_test() -> None:
    found = claims(DOC.read_text())
    assert len(found) >= 20
    assert sorted(found) == list(range(1, len(found) + 1))
    assert not [n for n, text in found.items() if not cited(text)], "claims citing no test"


def test_every_cited_test_exists() -> None:
    test_ids = sorted({t for text in claims(DOC.read_text()).values() for t in cited(text)})
    files = {t.split("::")[0] for t in test_ids}
    missing_files = sorted(f for f in files if not (REPO / f).is_file())
    assert not missing_files
    assert not unknown(test_ids, collected(files))


def test_the_checks_catch_a_stale_or_bare_claim() -> None:
    me = "tests/security/test_docs.py"
    doc = (
        f"1. Real.\n   Test: `{me}::test_every_cited_test_exists`.\n"
        f"2. Gone.\n   Test: `{me}::test_that_was_renamed`.\n"
        f"3. Bad parameter.\n   Test: `{me}::test_every_cited_test_exists[x]`.\n"
        "4. Nothing cited.\n"
    )
    found = claims(doc)
    assert sorted(found) == [1, 2, 3, 4] and cited(found[4]) == []
    known = collected({me})
    ids = [t for text in found.values() for t in cited(text)]
    assert unknown(ids, known) == ids[1:]
