"""The operator docs point at things that exist: relative links, chart paths, and every
test named as evidence in docs/security.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    REPO / "docs" / name
    for name in ("quickstart.md", "architecture.md", "operations.md", "migration.md", "security.md")
] + [REPO / "charts" / "fracgpu" / "README.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name if p.parent.name == "docs" else "chart")
def test_relative_links_resolve(doc: Path) -> None:
    text = doc.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name if p.parent.name == "docs" else "chart")
def test_repository_paths_exist(doc: Path) -> None:
    text = doc.read_text()
    for path in set(
        re.findall(r"`((?:charts|docker|tests|docs|webhook|agent|certs)/[\w./-]+)`", text)
    ):
        if "{" in path or "<" in path:
            continue
        assert (REPO / path.split("::")[0]).exists(), f"{doc.name} names missing {path}"


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def _resolve(file: str) -> Path:
    if file.startswith("tests/"):
        return REPO / file
    matches = sorted((REPO / "tests").rglob(file))  # a short name: test_limits.py
    assert len(matches) == 1, f"{file}: {len(matches)} files of that name under tests/"
    return matches[0]


def test_security_claims_name_real_tests() -> None:
    text = (REPO / "docs" / "security.md").read_text()
    # `path.py::name`, and `::name` right after one for another test of the same file.
    references = re.findall(r"`([\w/]+\.py)?::(\w+)`", text)
    current: Path | None = None
    for file, name in references:
        if file:
            current = _resolve(file)
        assert current is not None and current.is_file(), f"{file} does not exist"
        assert name in _test_names(current), f"{current.relative_to(REPO)} has no {name}"
    assert len(references) >= 12
