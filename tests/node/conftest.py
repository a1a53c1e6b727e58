"""The node tier (marker `node`): a real kubelet, containerd, runc, CNI, kube-scheduler and
kube-controller-manager with fracgpu's agent, webhook and shim (tests/node/tier/).

One tier per session, started by the first test that asks for it (~40 s) and stopped at the
end; the tests run serially (kubelet's device-plugin directory is machine-wide).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import E2EConfig, require_binaries
from tests.node.pods import new_namespace
from tests.node.tier.binaries import NodeTierUnavailableError, require_node_binaries
from tests.node.tier.tier import NodeTier

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.node)


@pytest.fixture(scope="session")
def node_tier(e2e_config: E2EConfig) -> Iterator[NodeTier]:
    plane_binaries = require_binaries(e2e_config)
    binaries = require_node_binaries(e2e_config)
    try:
        tier = NodeTier(binaries, plane_binaries, e2e_config).start()
    except NodeTierUnavailableError as error:
        if e2e_config.in_ci:
            pytest.fail(f"node tier cannot run in CI: {error}", pytrace=False)
        pytest.skip(f"node tier cannot run: {error}")
    print(f"\nnode tier started: {tier.timings}")
    try:
        yield tier
    finally:
        tier.close()


@pytest.fixture
def namespace(node_tier: NodeTier) -> Iterator[str]:
    """A fresh namespace; afterwards every pod is deleted and torn down by kubelet, so the
    next test starts on an empty GPU."""
    name = new_namespace(node_tier)
    yield name
    node_tier.delete_all_pods()
