"""The operator docs point at things that exist: relative links, chart paths, and every
test named as evidence in docs/security.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from tests.chart.render import render
from tests.chart.render_setup import renderer_or_skip
from webhook.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    REPO / "docs" / name
    for name in (
        "quickstart.md",
        "architecture.md",
        "operations.md",
        "migration.md",
        "security.md",
        "install-without-helm.md",
        "cluster-mode.md",
    )
] + [REPO / "charts" / "fracgpu" / "README.md"]
# Everything an operator reads: every page, the READMEs and the chart's NOTES.
OPERATOR_TEXTS = [
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "README.md",
    REPO / "charts" / "fracgpu" / "README.md",
    REPO / "charts" / "fracgpu" / "templates" / "NOTES.txt",
]
POLICIES = r"(binpack|spread|best-fit|fragmentation)"


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
        re.findall(
            r"`((?:charts|docker|tests|docs|webhook|agent|certs|deploy|scripts)/[\w./-]+)`", text
        )
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


@pytest.mark.parametrize("doc", OPERATOR_TEXTS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_install_command_from_a_public_index(doc: Path) -> None:
    # fracgpu is not on PyPI: `pip install fracgpu` would fail (or install someone else's
    # package). The docs build the wheel from the repository instead.
    found = re.findall(r"pip3? install (?:-\w+ )*fracgpu(?![\w./-])", doc.read_text())
    assert found == [], f"{doc.name} tells operators to {found[0]!r}"


def _default_policy() -> str:
    values = yaml.safe_load((REPO / "charts" / "fracgpu" / "values.yaml").read_text())
    chart = str(values["webhook"]["placementPolicy"])
    assert chart == Settings().policy.value  # the chart and the webhook agree first
    return chart


@pytest.mark.parametrize("doc", OPERATOR_TEXTS, ids=lambda p: str(p.relative_to(REPO)))
def test_docs_name_the_real_default_policy(doc: Path) -> None:
    text = doc.read_text()
    claims = re.findall(rf"`--policy`[^.\n|]{{0,12}}\((?:default )?`?{POLICIES}`?\)", text)
    claims += re.findall(rf"\bdefault (?:placement )?policy[:,]? `?{POLICIES}\b", text)
    claims += re.findall(rf"\b{POLICIES}`? (?:is the default|by default)\b", text)
    wrong = [claim for claim in claims if claim != _default_policy()]
    assert wrong == [], f"{doc.name} calls {wrong} the default policy"


# `cat > NAME.yaml <<'EOF'` ... `EOF` in a shell block: a values file the docs have the
# operator write, maybe indented under a list item.
_VALUES_FILE = re.compile(
    r"^(?P<indent>[ \t]*)cat > (?P<name>[\w.-]+\.yaml) <<'EOF'\n(?P<body>.*?)^(?P=indent)EOF$",
    re.MULTILINE | re.DOTALL,
)


def _values_files(doc: Path) -> list[tuple[str, str]]:
    found = []
    for match in _VALUES_FILE.finditer(doc.read_text()):
        indent = len(match["indent"])
        body = "".join(line[indent:] + "\n" for line in match["body"].splitlines())
        found.append((match["name"], body))
    return found


@pytest.mark.parametrize("doc", ["quickstart.md", "migration.md"])
def test_the_values_files_the_docs_write_install_the_chart(doc: str, tmp_path: Path) -> None:
    """An install as the doc writes it renders (the chart has no default registry) with
    what the file sets: the registry, and the migration's agent selector."""
    renderer = renderer_or_skip()
    (name, body), *more = _values_files(REPO / "docs" / doc)
    assert not more, f"{doc}: one values file expected"
    values = tmp_path / name
    values.write_text(body)
    written = yaml.safe_load(body)
    rendered = render(renderer=renderer, value_files=[values], installed=False)
    daemonset = rendered.one("DaemonSet")
    (agent,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert agent["image"].startswith(written["image"]["registry"] + "/")
    if "agent" in written:  # the migration's selector: the profile's label removed
        wanted = {k: v for k, v in written["agent"]["nodeSelector"].items() if v is not None}
        assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == wanted
