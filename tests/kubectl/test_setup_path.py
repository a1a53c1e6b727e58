"""After scripts/setup.sh, the PATH the README tells users to set holds every command,
the kubectl plugin included (kubectl finds `kubectl-fracgpu` there as `kubectl fracgpu`)."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_path_holds_every_command_and_setup_says_so() -> None:
    readme = (ROOT / "README.md").read_text()
    exports = re.findall(r'^export PATH="\$PWD/([^:"]+):\$PATH"$', readme, re.MULTILINE)
    assert exports == [".venv/bin"], "README must tell users which directory to put on PATH"
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "pip install -q -e '.[dev]'" in setup and ".venv/bin" in setup
    assert readme.index("bash scripts/setup.sh") < readme.index('export PATH="$PWD/.venv/bin')
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "kubectl-fracgpu" in scripts
    directory = ROOT / exports[0]
    env = {**os.environ, "PATH": f"{directory}{os.pathsep}/usr/bin:/bin"}
    for name in scripts:
        assert os.access(directory / name, os.X_OK), f"{name} is not in {directory}"
        result = subprocess.run(
            [name, "--version"],
            cwd="/",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, (name, result.stderr)
