"""Fixtures of the real-GPU suite: the machine's first GPU and a container on it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .container import REPO, Container, GiB, Gpu, torch_python


@pytest.fixture(scope="session")
def gpu() -> Gpu:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi: not a GPU machine")
    query = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    if query.returncode != 0 or not query.stdout.strip():
        pytest.skip(f"nvidia-smi found no GPU: {query.stderr.strip()}")
    python = torch_python()
    if python is None:
        pytest.skip("no Python with a CUDA-enabled PyTorch")
    subprocess.run(["make", "-s", "-C", str(REPO / "shim")], check=True, timeout=600)
    uuid, total = (x.strip() for x in query.stdout.splitlines()[0].split(","))
    return Gpu(uuid=uuid, total_mib=int(total), python=python)


@pytest.fixture
def box(tmp_path: Path, gpu: Gpu) -> Iterator[Container]:
    c = Container(tmp_path / "c0", gpu)
    c.limit(2 * GiB)
    yield c
