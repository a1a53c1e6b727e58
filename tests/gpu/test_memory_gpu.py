"""Every allocation path beyond cuMemAlloc on the real driver: the scripts the fake driver
runs (tests/shim/memory_scripts.py: managed, stream-ordered and pool memory, virtual memory
handles, graph memory nodes, captured allocations) give the same results on a 2 GiB slice.
Each prints its output, so a run records what the driver reserved."""

from __future__ import annotations

import pytest

from tests.shim.memory_scripts import SCRIPTS

from .container import Container, MiB

pytestmark = pytest.mark.gpu

UNIT = 2  # GiB: the box fixture's slice
# A real pool or graph pool may reserve a little past a request (its granularity); the
# slice counts what the driver reserved, so free memory may be this much lower.
SLACK = 64 * MiB


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_allocation_path_counts_on_the_real_driver(box: Container, name: str) -> None:
    out = box.program("mem_ops", *SCRIPTS[name].args(UNIT))
    print(f"--- {name}\n{out.stdout}{out.stderr}")
    assert out.returncode == 0, out.stdout + out.stderr
    SCRIPTS[name].check(out.stdout, UNIT, SLACK)
