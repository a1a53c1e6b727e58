"""Two pods on the one simulated GPU, paced by the shim in their real containers to their
compute shares (within 5 points, as the shim's own pacing tests hold it)."""

from __future__ import annotations

from fracgpu import names

from .pods import create, pod_body, wait_phase
from .tier.tier import NodeTier

TOLERANCE = 0.05
SECONDS = 8


def test_two_pods_on_one_gpu_are_paced_to_their_shares(node_tier: NodeTier, namespace: str) -> None:
    shares = {"thirty": 30, "sixty": 60}
    for name, cores in shares.items():
        # Launch 2 ms kernels back to back for SECONDS; report the share of wall time the GPU
        # spent on this container's kernels.
        script = f"/probes/launch_ops 2000 {SECONDS} launch > /dev/termination-log 2>&1"
        limits = {names.RESOURCE_VCUDA_CORE: str(cores), names.RESOURCE_VCUDA_MEMORY: "4"}
        create(node_tier, namespace, pod_body(name, limits=limits, command=script))
    measured = {}
    for name, cores in shares.items():
        pod = wait_phase(node_tier, namespace, name, ("Succeeded", "Failed"), 90)
        (status,) = pod.status.container_statuses
        report = status.state.terminated.message or ""
        fields = report.split()
        assert fields[:1] == ["launch"], report
        measured[name] = float(fields[3])
        assert abs(measured[name] - cores / 100) <= TOLERANCE, (name, measured)
    print(f"\npacing on the real node: {measured}")
