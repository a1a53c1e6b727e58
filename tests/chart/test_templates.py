"""Every template is a well-formed Go template that refers only to things that exist.

Rendering needs Helm (see the README's chart section); these checks need none.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import gotemplate
from tests.chart.chartfiles import CHART_DIR, COMPONENTS, RBAC_DIR

TEMPLATE_DIR = CHART_DIR / "templates"
TEMPLATES = sorted(p for p in TEMPLATE_DIR.iterdir() if p.is_file())


def _parsed(path: Path) -> gotemplate.Template:
    return gotemplate.parse(path.name, path.read_text())


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return values


def _defined_names() -> set[str]:
    names: set[str] = set()
    for path in TEMPLATES:
        names.update(_parsed(path).defined_names())
    return names


def test_chart_has_the_expected_templates() -> None:
    names = {p.name for p in TEMPLATES}
    for required in (
        "webhook-deployment.yaml",
        "webhook-service.yaml",
        "webhook-pdb.yaml",
        "webhook-configurations.yaml",
        "agent-daemonset.yaml",
        "rbac.yaml",
        "serviceaccounts.yaml",
        "certs-hook.yaml",
        "NOTES.txt",
    ):
        assert required in names


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.name for p in TEMPLATES])
def test_template_is_structurally_valid(path: Path) -> None:
    template = _parsed(path)
    assert template.actions, f"{path.name} has no template actions"


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.name for p in TEMPLATES])
def test_values_paths_exist(path: Path) -> None:
    values = _values()
    missing = []
    for keys in sorted(_parsed(path).values_paths()):
        node: Any = values
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                missing.append(".".join(keys))
                break
            node = node[key]
    assert missing == [], f"{path.name} reads values that values.yaml does not define"


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.name for p in TEMPLATES])
def test_included_templates_are_defined(path: Path) -> None:
    defined = _defined_names()
    template = _parsed(path)
    used = template.string_arguments_of("include") + template.string_arguments_of("template")
    assert sorted(set(used) - defined) == []


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.name for p in TEMPLATES])
def test_only_known_functions_are_called(path: Path) -> None:
    assert sorted(_parsed(path).functions_called() - gotemplate.FUNCTIONS) == []


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.name for p in TEMPLATES])
def test_files_read_by_templates_exist(path: Path) -> None:
    for relative in _parsed(path).string_arguments_of("Files.Get"):
        assert (CHART_DIR / relative).is_file(), f"{path.name} reads missing {relative}"


def test_rbac_files_exist_for_every_component() -> None:
    # rbac.yaml and certs-hook.yaml build the path files/rbac/<component>.yaml.
    for component in COMPONENTS:
        assert (RBAC_DIR / f"{component}.yaml").is_file()
    helpers = (TEMPLATE_DIR / "_helpers.tpl").read_text()
    assert 'printf "files/rbac/%s.yaml"' in helpers


def test_webhook_configurations_come_from_the_shared_file() -> None:
    text = (TEMPLATE_DIR / "webhook-configurations.yaml").read_text()
    assert '.Files.Get "files/webhooks.yaml"' in text
    # The template must not define rules of its own: those live in the shared file only.
    # It only adds what values.webhooks says (failure policies through the file's
    # placeholders, selector additions).
    body = text.split("*/", 1)[1]
    for field in ("failurePolicy:", "sideEffects", "rules:", "namespaceSelector:", "NotIn"):
        assert field not in body, field


BROKEN = [
    ("{{ if .Values.a }}x", "never closed"),
    ("{{ end }}", "without an open block"),
    ("{{ .Values.a ", "never closed"),
    ("x }} y", "without an opening"),
    ("{{ else }}", "outside if/range/with"),
    ('{{ printf "%s" (.Values.a }}', "unbalanced"),
    ('{{ printf "%s" .Values.a) }}', "without '('"),
    ("{{/* unclosed comment }}", "never closed"),
    ('{{ define "x" }}{{ range .a }}{{ end }}', "never closed"),
    ("{{ define x }}{{ end }}", "quoted name"),
    ("{{ if }}{{ end }}", "needs an argument"),
    ('{{ $a := "unterminated }}\n', "string not closed"),
    ("{{ }}", "empty action"),
    ("{{ .a {{ .b }}", "opened inside an action"),
]


@pytest.mark.parametrize(("source", "message"), BROKEN, ids=[b[1] + ":" + b[0] for b in BROKEN])
def test_checker_rejects_broken_templates(source: str, message: str) -> None:
    with pytest.raises(gotemplate.TemplateSyntaxError, match=re.escape(message)):
        gotemplate.parse("broken.yaml", source)


def test_checker_reads_references() -> None:
    template = gotemplate.parse(
        "t.yaml",
        '{{- /* c */ -}}{{ define "a.b" }}{{ $.Values.x.y | quote }}{{ end }}'
        '{{ include "a.b" . }}{{ .Files.Get "files/f.yaml" | fromYaml }}'
        "{{ range $k, $v := .Values.m }}{{ $k }}{{ else }}{{ toYaml .Values.n.o }}{{ end }}",
    )
    assert template.values_paths() == {("x", "y"), ("m",), ("n", "o")}
    assert template.defined_names() == ["a.b"]
    assert template.string_arguments_of("include") == ["a.b"]
    assert template.string_arguments_of("Files.Get") == ["files/f.yaml"]
    assert template.functions_called() == {"quote", "include", "fromYaml", "toYaml"}
