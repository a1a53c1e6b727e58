"""docs/security.md's "Admission closes the doors" table cannot go stale: every row names
an attack, what stops it and at least one test pytest collects today."""

from __future__ import annotations

from tests.security.test_docs import _TEST_ID, DOC, collected, unknown

SECTION = "## Admission closes the doors"


def rows() -> list[list[str]]:
    text = DOC.read_text()
    assert SECTION in text
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    table = [line for line in body.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table[2:]]


def test_every_row_names_an_attack_a_defence_and_collected_tests() -> None:
    found = rows()
    assert len(found) >= 10
    cited = []
    for attack, defence, tests in found:
        assert attack and defence, (attack, defence)
        ids = _TEST_ID.findall(tests)
        assert ids, f"row {attack!r} cites no test"
        cited.extend(ids)
    files = {t.split("::")[0] for t in cited}
    assert not unknown(sorted(set(cited)), collected(files))
