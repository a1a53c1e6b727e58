"""Run the real `fracgpu` command in a child process with only the given FRACGPU_* variables
(none inherited from the test run)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from webhook import settings

ROOT = Path(__file__).resolve().parents[2]


def run_fracgpu(
    args: Sequence[str], environ: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(settings.ENV_PREFIX)}
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli.main", *args],
        cwd=ROOT,
        env={**base, **environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
