"""The pod-resources client against a real gRPC server (the test kubelet's)."""

from pathlib import Path

import pytest

from agent.podresources import PodResourcesClient, PodResourcesError, find_holder
from tests.agent.kubelet import ContainerRef, TestKubelet


def test_lists_containers_with_their_device_ids(short_dir: Path) -> None:
    kubelet = TestKubelet(short_dir / "dp", short_dir / "pr.sock")
    kubelet.start()
    try:
        a, b = ContainerRef("ns", "pod", "a"), ContainerRef("ns", "pod", "b")
        with kubelet.lock:
            kubelet.allocations[(a, "tencent.com/vcuda-core")] = ["g-core-1", "g-core-2"]
            kubelet.allocations[(a, "tencent.com/vcuda-memory")] = ["g-mem-1"]
            kubelet.allocations[(b, "tencent.com/vcuda-core")] = ["g-core-3"]
            kubelet.allocations[(b, "example.com/other")] = ["x"]
        listed = PodResourcesClient(short_dir / "pr.sock").list()
        by_name = {c.container: c for c in listed}
        assert by_name["a"].devices == {
            "tencent.com/vcuda-core": frozenset({"g-core-1", "g-core-2"}),
            "tencent.com/vcuda-memory": frozenset({"g-mem-1"}),
        }
        holder = find_holder(listed, "tencent.com/vcuda-core", ["g-core-2", "g-core-1"])
        assert holder is not None and holder.container == "a"
        assert find_holder(listed, "tencent.com/vcuda-core", ["g-core-1"]) is None  # subset
        assert find_holder(listed, "tencent.com/vcuda-memory", ["g-core-3"]) is None
    finally:
        kubelet.close()


def test_unreachable_kubelet_is_a_clear_error(short_dir: Path) -> None:
    with pytest.raises(PodResourcesError, match=r"pod-resources List on .*pr\.sock failed"):
        PodResourcesClient(short_dir / "pr.sock", timeout_seconds=1).list()
