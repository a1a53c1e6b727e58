"""The import contracts really bite: a core that imports an I/O library or a component fails."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _about_the_core(contract: dict[str, Any]) -> bool:
    """Whether the contract can be checked here: the tree has the core, and components empty.

    A contract over a component's sub-packages (those of webhook/, say) needs their code."""
    named: list[str] = [
        module
        for key in ("source_modules", "forbidden_modules", "modules", "layers", "containers")
        for module in contract.get(key, [])
    ]
    return not any("." in m and m.split(".")[0] != "fracgpu" for m in named)


def _run_contracts(tree: Path) -> subprocess.CompletedProcess[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    ini = ["[importlinter]", "root_packages ="]
    ini += [f"    {p}" for p in config["root_packages"]]
    ini.append("include_external_packages = True")
    for i, contract in enumerate(c for c in config["contracts"] if _about_the_core(c)):
        ini.append(f"[importlinter:contract:{i}]")
        for key, value in contract.items():
            if isinstance(value, list):
                ini.append(f"{key} =")
                ini += [f"    {v}" for v in value]
            else:
                ini.append(f"{key} = {value}")
    (tree / ".importlinter").write_text("\n".join(ini) + "\n")
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / ".importlinter"), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "fracgpu", tmp_path / "fracgpu")
    for component in ("webhook", "agent", "certs", "bench"):
        (tmp_path / component).mkdir()
        (tmp_path / component / "__init__.py").write_text("")
    return tmp_path


def test_the_real_core_keeps_every_contract(tree: Path) -> None:
    result = _run_contracts(tree)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("forbidden", ["aiohttp", "kubernetes", "pynvml", "grpc", "webhook"])
def test_a_core_importing_io_or_a_component_is_refused(tree: Path, forbidden: str) -> None:
    (tree / "fracgpu" / "leak.py").write_text(f"import {forbidden}\n")
    result = _run_contracts(tree)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
