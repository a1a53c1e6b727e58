"""The FGD policy (Weng et al., ATC'23), kept to compare against: a node's fragmentation for a
task type is its free GPU compute that the type cannot use (all of it when one task of the
type does not fit the node at all); a pod goes where the popularity-weighted fragmentation
grows least."""

from fracgpu.model import WHOLE_CARD, GPUAllocation
from fracgpu.placement import ClusterView, Placement, PodDemand, Policy
from tests.placement.helpers import container, node, share, uuids


def placed(view: ClusterView, demand: PodDemand, policy: Policy) -> Placement:
    result = view.place(demand, policy)
    assert isinstance(result, Placement), result
    return result


def test_fgd_picks_the_gpu_whose_use_fragments_least() -> None:
    """50-core tasks are typical. A 40-core pod on the GPU with 60 free leaves 20 no such task
    can use (+20 fragmentation); on the free GPU both keep room for one (+0)."""
    view = ClusterView([node("a", 2)])
    for _ in range(10):
        view.observe(share(50))
    view.allocate("a", [GPUAllocation("a-gpu0", 40, 0)])
    assert uuids(placed(view, share(40), Policy.BINPACK)) == ["a-gpu0"]
    assert uuids(placed(view, share(40), Policy.FGD)) == ["a-gpu1"]


def test_fgd_counts_a_node_usable_while_one_task_fits() -> None:
    """Whole-GPU tasks with 4,096m CPU are typical. Node a can feed two more (8,192m), node b
    one (4,600m). A 500m CPU-only pod leaves one task fitting on either node, so FGD sees no
    fragmentation either way (ties go to the first node); the fragmentation policy counts
    that a would then feed only one of its two free GPUs, and picks b."""
    view = ClusterView([node("a", 2, cpu_milli=8192), node("b", 2, cpu_milli=4600)])
    whole = PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=4096)
    for _ in range(5):
        view.observe(whole)
    cpu_only = PodDemand((), cpu_milli=500)
    assert placed(view, cpu_only, Policy.FGD).node == "a"
    assert placed(view, cpu_only, Policy.FRAGMENTATION).node == "b"


def test_fgd_task_types_keep_their_exact_cpu() -> None:
    """The typical task asks 3,152m CPU. After a 100m pod node a would keep 3,100m: too
    little for one such task, so its free GPU becomes fragmentation, and FGD picks b. (The
    fragmentation policy's shapes round CPU down to 2,896m, to which a still looks fine.)"""
    view = ClusterView([node("a", 1, cpu_milli=3200), node("b", 1, cpu_milli=64000)])
    whole = PodDemand((container("main", 100, WHOLE_CARD),), cpu_milli=3152)
    for _ in range(5):
        view.observe(whole)
    assert placed(view, PodDemand((), cpu_milli=100), Policy.FGD).node == "b"


def test_a_fixed_fgd_workload_is_not_moved_by_arrivals() -> None:
    """The paper's simulator reads FGD's task types from the whole trace up front, CPU-only
    pods included. Fixed to 60-core tasks, a 40-core pod goes to the free GPU (on a0, with 60
    free, it would leave 20 no such task can use), however many 20-core pods arrive after;
    learned from those arrivals instead, 20 left on a0 is still usable and a0 (first) wins."""

    def build() -> ClusterView:
        view = ClusterView([node("a", 2)])
        view.allocate("a", [GPUAllocation("a-gpu0", 40, 0)])
        return view

    fixed, learned = build(), build()
    fixed.set_fgd_workload([share(60)] * 5 + [PodDemand((), cpu_milli=1000)])
    for view in (fixed, learned):
        for _ in range(200):  # over 95 % of what arrives: the only typical type learned
            view.observe(share(20))
    assert uuids(placed(fixed, share(40), Policy.FGD)) == ["a-gpu1"]
    assert uuids(placed(learned, share(40), Policy.FGD)) == ["a-gpu0"]
