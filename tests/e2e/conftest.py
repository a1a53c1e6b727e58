"""Everything under tests/e2e needs the control plane (fixtures: tests/e2e/fixtures.py)."""

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything under tests/e2e needs the control plane: select with -m e2e / -m "not e2e".
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
