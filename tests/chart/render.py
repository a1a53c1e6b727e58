"""Render the chart without helm: build tests/chart/render (Go text/template + Sprig, Helm's
template engine and function library) once into the cache and run it.

Needs Go and Debian's golang-github-masterminds-sprig-dev and golang-gopkg-yaml.v2-dev
(scripts/install-system-deps.sh). The binary is cached under
``${FRACGPU_CACHE:-~/.cache/fracgpu}/chart-render/<hash of the source>/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from tests.chart.chartfiles import CHART_DIR

SOURCE: Final = Path(__file__).resolve().parent / "render" / "main.go"
# The values an install must set (the image registry), read before any other values file.
INSTALLED_VALUES: Final = Path(__file__).resolve().parent / "installed-values.yaml"
DEBIAN_GOPATH: Final = Path("/usr/share/gocode")
PACKAGES: Final = "golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v2-dev"
# Sprig imports its /v3 module paths; in GOPATH mode they need a directory of that name.
_V3_LINKS: Final = ("github.com/Masterminds/sprig", "github.com/Masterminds/semver")


class RendererUnavailableError(RuntimeError):
    """Go or the Go libraries the renderer needs are not installed."""


class RenderError(RuntimeError):
    """The chart did not render (a template error, or a fail/required in the chart)."""


def _cache_dir() -> Path:
    if os.environ.get("FRACGPU_CACHE"):
        return Path(os.environ["FRACGPU_CACHE"])
    return Path(os.environ.get("HOME", str(Path.home()))) / ".cache" / "fracgpu"


def build_renderer() -> Path:
    """The renderer binary, built on first use."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    target = _cache_dir() / "chart-render" / digest / "fracgpu-chart-render"
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None or not (DEBIAN_GOPATH / "src" / _V3_LINKS[0]).is_dir():
        raise RendererUnavailableError(
            f"the chart renderer needs Go and Sprig: apt-get install {PACKAGES}"
        )
    work = target.parent / "gopath"
    package = work / "src" / "fracgpurender"
    package.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SOURCE, package / "main.go")
    for module in _V3_LINKS:
        link = work / "src" / module / "v3"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(DEBIAN_GOPATH / "src" / module)
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{work}:{DEBIAN_GOPATH}",
        "GOCACHE": str(target.parent / "gocache"),
        "CGO_ENABLED": "0",
    }
    result = subprocess.run(
        [go, "build", "-o", str(target), "."],
        cwd=package,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RendererUnavailableError(
            f"building the chart renderer failed (apt-get install {PACKAGES}):\n{result.stderr}"
        )
    return target


@dataclass(frozen=True)
class Rendered:
    """One rendering: template path -> text, and the objects parsed from it."""

    templates: dict[str, str]

    @property
    def notes(self) -> str:
        return next(text for name, text in self.templates.items() if name.endswith("NOTES.txt"))

    def objects(self) -> list[dict[str, Any]]:
        found = []
        for name, text in sorted(self.templates.items()):
            if name.endswith(".txt"):
                continue
            for document in yaml.safe_load_all(text):
                if document is not None:
                    found.append(document)
        return found

    def find(self, kind: str, name: str | None = None) -> list[dict[str, Any]]:
        return [
            o
            for o in self.objects()
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
        ]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        matches = self.find(kind, name)
        if len(matches) != 1:
            raise AssertionError(f"expected one {kind} {name or ''}, found {len(matches)}")
        return matches[0]


def render(
    *,
    value_files: Sequence[Path] = (),
    values: Mapping[str, Any] | None = None,
    name: str = "fracgpu",
    namespace: str = "fracgpu-system",
    kube_version: str = "v1.20.2",
    renderer: Path | None = None,
    release_service: str = "Helm",
    installed: bool = True,
) -> Rendered:
    """``helm template NAME charts/fracgpu -n NAMESPACE -f ... --set-json ...``;
    ``installed``: with ``INSTALLED_VALUES`` first, as every install sets them."""
    command = [str(renderer or build_renderer()), "-chart", str(CHART_DIR), "-name", name]
    command += ["-namespace", namespace, "-kube-version", kube_version]
    command += ["-release-service", release_service]
    for file in ((INSTALLED_VALUES,) if installed else ()) + tuple(value_files):
        command += ["-f", str(file)]
    if values:
        command += ["-set-json", json.dumps(values)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RenderError(result.stderr.strip())
    return Rendered(json.loads(result.stdout))
