"""What users see when a GPU pod cannot be placed, and what a pod without GPUs gets on a GPU
node, on the real node."""

from __future__ import annotations

from fracgpu import names

from .pods import admission_denial, create, pod_body, read, run_probe, sections, wait_running
from .tier.tier import NodeTier


def tke(cores: int, blocks: int) -> dict[str, str]:
    return {names.RESOURCE_VCUDA_CORE: str(cores), names.RESOURCE_VCUDA_MEMORY: str(blocks)}


def test_pod_no_gpu_could_ever_hold_is_refused_with_the_reason(
    node_tier: NodeTier, namespace: str
) -> None:
    # 100 x 256 MiB = 25 GiB on a node whose one GPU has 16 GiB.
    denial = admission_denial(node_tier, namespace, pod_body("huge", limits=tke(50, 100)))
    assert "could ever hold this pod" in denial, denial


def test_pod_that_does_not_fit_now_is_refused_with_what_is_free(
    node_tier: NodeTier, namespace: str
) -> None:
    create(node_tier, namespace, pod_body("holder", limits=tke(80, 8)))
    wait_running(node_tier, namespace, "holder")
    denial = admission_denial(node_tier, namespace, pod_body("late", limits=tke(30, 8)))
    # The answer names what was asked and what the best GPU has free (20 of 100 cores).
    assert "30" in denial and "20" in denial, denial
    assert "could ever" not in denial, denial


def test_pod_without_gpus_sees_no_gpu(node_tier: NodeTier, namespace: str) -> None:
    script = """{
echo "== env"; echo "NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-unset}"
echo "== files"
for f in /etc/fracgpu/limits /etc/ld.so.preload /usr/lib/x86_64-linux-gnu/libcuda.so.1 \
         /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 /usr/local/fracgpu/lib/libfracgpu.so; do
  if [ -e "$f" ]; then echo "present $f"; fi
done
echo "== cuda"; /probes/mem_ops ctx 0 info 2>&1; echo "exit=$?"
} > /dev/termination-log 2>&1
"""
    report = run_probe(node_tier, namespace, pod_body("plain", command=script))
    seen = sections(report)
    assert seen["env"] == ["NVIDIA_VISIBLE_DEVICES=void"], report
    assert seen["files"] == [], report  # no driver, no shim, no limits
    # A CUDA program finds no driver at all.
    assert seen["cuda"][-1] == "exit=127", report
    assert "libcuda.so.1" in "\n".join(seen["cuda"]), report
    pod = read(node_tier, namespace, "plain")
    assert names.ANNOTATION_ASSIGNMENT not in (pod.metadata.annotations or {})
