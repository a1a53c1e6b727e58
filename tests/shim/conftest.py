from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.shim.sandbox import Sandbox, build_shim


@pytest.fixture(scope="session")
def shim_build() -> Path:
    return build_shim()


@pytest.fixture
def node(tmp_path: Path, shim_build: Path) -> Iterator[Sandbox]:
    box = Sandbox(root=tmp_path)
    box.write_fake_config()
    box.write_limits()
    yield box
    box.stop_boards()
