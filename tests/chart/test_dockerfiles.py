"""The Dockerfiles (not buildable here: no container engine) copy files that exist, build
the shim with its real make target, and start console scripts that exist and run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agent.settings import AgentSettings
from tests.chart.chartfiles import CHART_DIR
from tests.dockerfiles import DOCKERFILES, REPO, copies, instructions


def _console_scripts() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    scripts: dict[str, str] = project["project"]["scripts"]
    return scripts


def test_both_images_exist() -> None:
    assert [p.name for p in DOCKERFILES] == ["agent.Dockerfile", "webhook.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_copied_sources_exist(dockerfile: Path) -> None:
    stages = {rest.split()[-1] for keyword, rest in instructions(dockerfile) if keyword == "FROM"}
    for stage, sources, _ in copies(dockerfile):
        if stage is not None:
            assert stage in stages, f"COPY --from={stage}: no such build stage"
            continue
        for source in sources:
            assert (REPO / source).exists(), f"{dockerfile.name} copies missing {source}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_package_sources_cover_pyproject(dockerfile: Path) -> None:
    """Every package pyproject installs is copied before `pip wheel .`."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = {
        s.rstrip("/") for stage, sources, _ in copies(dockerfile) if not stage for s in sources
    }
    for pattern in patterns:
        assert pattern.rstrip("*") in copied, pattern
    assert "pyproject.toml" in copied and "README.md" in copied  # readme = README.md


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_entrypoint_is_a_console_script(dockerfile: Path) -> None:
    (entrypoint,) = [rest for keyword, rest in instructions(dockerfile) if keyword == "ENTRYPOINT"]
    command = json.loads(entrypoint)  # exec form: no shell between kubelet and the process
    assert command[0] in _console_scripts()


def test_shim_stage_builds_the_copied_library(tmp_path: Path) -> None:
    """Run the agent image's shim build step on a copy of shim/ and check its output."""
    dockerfile = REPO / "docker" / "agent.Dockerfile"
    runs = [rest for keyword, rest in instructions(dockerfile) if keyword == "RUN"]
    (make,) = [r for r in runs if r.startswith("make ")]
    target = make.split()[-1]
    (copied,) = [sources[0] for stage, sources, _ in copies(dockerfile) if stage == "shim"]
    assert copied == f"/src/shim/{target}"
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.fail("make and cc are needed (scripts/setup.sh installs build-essential)")
    shutil.copytree(REPO / "shim", tmp_path / "shim", ignore=shutil.ignore_patterns("build"))
    subprocess.run(["make", "-s", "-C", "shim", target], cwd=tmp_path, check=True)
    library = tmp_path / "shim" / target
    assert library.read_bytes().startswith(b"\x7fELF")


def test_shim_lands_where_the_agent_and_chart_expect_it() -> None:
    dockerfile = REPO / "docker" / "agent.Dockerfile"
    (destination,) = [dest for stage, _, dest in copies(dockerfile) if stage == "shim"]
    assert destination == str(AgentSettings(node_name="x").shim_source)
    daemonset = (CHART_DIR / "templates" / "agent-daemonset.yaml").read_text()
    assert f"value: {destination}" in daemonset


def test_webhook_image_user_matches_the_chart() -> None:
    dockerfile = REPO / "docker" / "webhook.Dockerfile"
    (user,) = [rest for keyword, rest in instructions(dockerfile) if keyword == "USER"]
    helpers = (CHART_DIR / "templates" / "_helpers.tpl").read_text()
    uid = user.split(":")[0]
    assert f"runAsUser: {uid}" in helpers and f"runAsGroup: {user.split(':')[1]}" in helpers


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        # What the images and the chart run, without what a cluster provides: each entry
        # point starts, reads its settings and stops with its own clear message.
        ("fracgpu", ["serve"], "serving needs --tls-cert-file"),
        ("fracgpu-agent", [], "the node name is required"),
        ("fracgpu-certs", ["ensure", "--ca-validity", "soon"], "is not a duration"),
    ],
)
def test_entry_points_run(script: str, args: list[str], expected: str) -> None:
    assert script in _console_scripts()
    executable = Path(sys.executable).parent / script
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRACGPU", "NODE_NAME"))}
    result = subprocess.run(
        [str(executable), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
