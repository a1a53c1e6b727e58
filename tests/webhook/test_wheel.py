"""``python -m build`` makes a wheel that installs into a fresh virtual environment and runs
every command: built from a copy of the tree (no stale build/ directory), installed with pip
into a new venv, run from outside the checkout. The dependencies come from the development
environment (a .pth line; no network here), and a separate check shows that every third-party
module the wheel imports belongs to a distribution the wheel declares."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from fracgpu import __version__
from tests.dockerfiles import DOCKERFILES, sources_copied_into

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {
    "fracgpu": "fracgpu",
    "fracgpu-agent": "fracgpu-agent",
    "fracgpu-certs": "fracgpu-certs",
    "fracgpu-bench": "fracgpu-bench",
    "kubectl-fracgpu": "kubectl fracgpu",
    "fracgpu-shim": "fracgpu-shim",
}
OWN = {"fracgpu", "webhook", "agent", "certs", "bench"}
# `fracgpu-bench admission`'s API-server part drives the checkout's e2e harness (tests/):
# it runs from a checkout only, and says so (bench/admission/cli.py).
CHECKOUT_ONLY = {"tests"}


def _run(args: list[str | Path], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from exactly what the images' build stage copies (docker/*.Dockerfile), so the
    wheel tested here is the one the images install."""
    pytest.importorskip("build", reason="the dev extra installs `build`")
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    copied = {path.name: sources_copied_into(path, "build") for path in DOCKERFILES}
    (first, *others) = copied.values()
    assert all(sorted(other) == sorted(first) for other in others), copied
    ignored = shutil.ignore_patterns("__pycache__", "*.egg-info", ".*_cache", "*.so")
    for name in first:
        origin, target = ROOT / name.rstrip("/"), source / name.rstrip("/")
        if origin.is_dir():
            shutil.copytree(origin, target, ignore=ignored)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)
    built = _run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp, source],
        cwd=tmp,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (found,) = tmp.glob("fracgpu-*.whl")
    return found


def test_the_wheel_installs_into_a_fresh_venv_and_every_command_runs(
    wheel: Path, tmp_path: Path
) -> None:
    assert wheel.name == f"fracgpu-{__version__}-py3-none-any.whl"
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel],
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr
    # Dependencies from the development environment, after the venv's own site-packages.
    site = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path
    ).stdout.strip()
    (Path(site) / "zz-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = _run([python, "-c", "import webhook, fracgpu; print(webhook.__file__)"], cwd=tmp_path)
    assert where.stdout.strip().startswith(site), where.stdout + where.stderr
    for script, prog in COMMANDS.items():
        result = _run([venv / "bin" / script, "--version"], cwd=tmp_path)
        assert result.returncode == 0, (script, result.stderr)
        assert result.stdout.strip() == f"{prog} {__version__}"
    demo = _run([venv / "bin" / "fracgpu", "demo"], cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert re.search(r"\d+ pods: \d+ admitted, \d+ denied", demo.stdout)
    assert str(venv / "share" / "fracgpu" / "examples") in demo.stdout


def test_every_third_party_import_is_a_declared_dependency(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"fracgpu-{__version__}.dist-info/METADATA").decode()
        sources = {
            name: archive.read(name).decode() for name in archive.namelist() if name.endswith(".py")
        }
    declared = {
        _normal(re.split(r"[ ;<>=!~\[]", line.split(":", 1)[1].strip())[0])
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    }
    owners = importlib.metadata.packages_distributions()
    imported: dict[str, str] = {}
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            for module in modules:
                imported.setdefault(module.split(".")[0], name)
    missing = {
        top: (owners.get(top), where)
        for top, where in imported.items()
        if top not in OWN | CHECKOUT_ONLY
        and top not in sys.stdlib_module_names
        and not ({_normal(d) for d in owners.get(top, [top])} & declared)
    }
    assert missing == {}, f"imported but not in [project] dependencies: {missing}"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
