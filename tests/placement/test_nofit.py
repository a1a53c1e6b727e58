"""NoFit: NEVER when no empty node could hold the pod, NOT_NOW otherwise, with a message
that says what was asked and which GPUs came closest."""

from fracgpu.model import WHOLE_CARD, GPUAllocation, MemoryRequest
from fracgpu.placement import ClusterView, Constraints, NoFit, NoFitReason, PodDemand, Policy
from tests.placement.helpers import CARD_MIB, container, node, share


def no_fit(view: ClusterView, demand: PodDemand, policy: Policy = Policy.BINPACK) -> NoFit:
    result = view.place(demand, policy)
    assert isinstance(result, NoFit), result
    return result


def test_never_when_no_node_has_enough_gpus() -> None:
    view = ClusterView([node("a", 2), node("b", 4)])
    result = no_fit(view, PodDemand((container("train", 100, WHOLE_CARD, gpus=8),)))
    assert result.reason is NoFitReason.NEVER
    assert 'container "train": 8 GPU x 100 cores' in result.message
    assert "could ever hold" in result.message


def test_never_when_the_card_is_too_small() -> None:
    view = ClusterView([node("a", 1)])
    result = no_fit(view, share(10, memory_mib=20000))
    assert result.reason is NoFitReason.NEVER
    assert "20000 MiB" in result.message


def test_never_when_the_model_is_missing() -> None:
    view = ClusterView([node("a", 1)])
    result = no_fit(view, share(10, constraints=Constraints(include_models=("H100",))))
    assert result.reason is NoFitReason.NEVER
    assert "GPU model" in result.message


def test_the_message_names_the_constraints_that_narrowed_the_choice() -> None:
    view = ClusterView([node("a", 1)])
    constraints = Constraints(
        include_models=("H100", "H200"),
        exclude_models=("PCIe",),
        include_uuids=("u1", "u2", "u3"),
        pools=("train",),
    )
    message = no_fit(view, share(10, constraints=constraints)).message
    assert "only GPU models H100, H200; no GPU models PCIe" in message
    assert "only 3 GPUs named by UUID;" in message  # counted, never listed
    assert "only pools train" in message


def test_gpus_narrowed_by_node_are_not_called_named() -> None:
    view = ClusterView([node("a", 1)])
    narrowed = Constraints(nodes=frozenset({"a"}))
    message = no_fit(view, share(10, memory_mib=20000, constraints=narrowed)).message
    assert "named" not in message


def test_mig_and_unhealthy_gpus_are_named_as_left_out() -> None:
    view = ClusterView([node("a", 1, model="NVIDIA A30", mig=(0,)), node("b", 2, unhealthy=(1,))])
    view.allocate("b", [GPUAllocation("b-gpu0", 100, 1024)])
    only_a30 = Constraints(include_models=("A30",))
    never = no_fit(view, share(10, constraints=only_a30))
    assert never.reason is NoFitReason.NEVER
    assert "left out: a/gpu0 (NVIDIA A30) is in MIG mode (fracgpu does not share MIG" in (
        never.message
    )
    assert "b/gpu1" not in never.message  # a T4: the pod could not use it anyway
    not_now = no_fit(view, share(10))
    assert not_now.reason is NoFitReason.NOT_NOW
    assert "a/gpu0 (NVIDIA A30) is in MIG mode" in not_now.message
    assert "b/gpu1 (Tesla T4) is unhealthy" in not_now.message
    # A GPU too small for the request is not worth naming.
    too_big = no_fit(view, share(10, memory_mib=20000, constraints=only_a30))
    assert "left out" not in too_big.message


def test_a_gpu_full_by_the_split_count_says_so() -> None:
    view = ClusterView([node("a", 1, split_count=2)])
    view.allocate("a", [GPUAllocation("a-gpu0", 10, 1024)])
    view.allocate("a", [GPUAllocation("a-gpu0", 10, 1024)])
    result = no_fit(view, share(10))
    assert result.reason is NoFitReason.NOT_NOW
    assert (
        "a/gpu0 (Tesla T4) has 80 cores and 14336 MiB free but already holds 2 containers: "
        "the split count of its node allows 2 per GPU" in result.message
    )


def test_never_when_node_cpu_is_too_small() -> None:
    view = ClusterView([node("a", 1, cpu_milli=4000)])
    result = no_fit(view, share(10, cpu_milli=8000))
    assert result.reason is NoFitReason.NEVER
    assert "8000m CPU" in result.message


def test_not_now_names_the_best_candidates() -> None:
    view = ClusterView([node("a", 2), node("b", 1)])
    view.allocate("a", [GPUAllocation("a-gpu0", 80, 1024), GPUAllocation("a-gpu1", 90, 1024)])
    view.allocate("b", [GPUAllocation("b-gpu0", 70, 2048)])
    for policy in Policy:
        result = no_fit(view, share(50), policy)
        assert result.reason is NoFitReason.NOT_NOW
        assert 'container "main": 1 GPU x 50 cores + 1024 MiB' in result.message
        # Most free compute first: b-gpu0 (30), a-gpu0 (20), a-gpu1 (10).
        first = result.message.index("b/gpu0")
        second = result.message.index("a/gpu0")
        third = result.message.index("a/gpu1")
        assert first < second < third
        assert "has 30 cores and 14336 MiB free" in result.message


def test_not_now_for_a_percentage_request() -> None:
    view = ClusterView([node("a", 1)])
    view.allocate("a", [GPUAllocation("a-gpu0", 10, 10000)])
    result = no_fit(view, PodDemand((container("main", 10, MemoryRequest(percent=50)),)))
    assert result.reason is NoFitReason.NOT_NOW
    assert "50% of the card's memory" in result.message


def test_empty_cluster_is_never() -> None:
    result = no_fit(ClusterView(), share(10))
    assert result.reason is NoFitReason.NEVER


def test_a_pod_without_cpu_or_memory_requests_is_described_without_them() -> None:
    view = ClusterView([node("a", 1)])
    message = no_fit(view, share(10, memory_mib=20000)).message
    assert 'container "main": 1 GPU x 10 cores + 20000 MiB)' in message
    assert "0m CPU" not in message


# -- a pod narrowed to some nodes: which of the others could hold it (the denial names them) --


def test_a_left_out_node_that_could_ever_hold_the_pod_is_named() -> None:
    view = ClusterView([node("a", 1), node("b", 1, model="NVIDIA A100", memory_mib=81920)])
    narrowed = share(10, memory_mib=40000, constraints=Constraints(nodes=frozenset({"a"})))
    result = no_fit(view, narrowed)
    assert result.reason is NoFitReason.NEVER
    assert view.fitting_elsewhere(narrowed, result.reason) == ("b",)


def test_a_pod_that_fits_nowhere_names_no_left_out_node() -> None:
    view = ClusterView([node("a", 1), node("b", 1, model="NVIDIA A100", memory_mib=81920)])
    huge = share(10, memory_mib=8 * 1024 * 1024, constraints=Constraints(nodes=frozenset({"a"})))
    result = no_fit(view, huge)
    assert result.reason is NoFitReason.NEVER
    assert view.fitting_elsewhere(huge, result.reason) == ()


def test_a_left_out_node_of_another_model_is_not_named() -> None:
    view = ClusterView([node("a", 1), node("b", 1, model="NVIDIA A100", memory_mib=81920)])
    view.allocate("a", [GPUAllocation("a-gpu0", 100, CARD_MIB)])
    t4_on_a = Constraints(include_models=("T4",), nodes=frozenset({"a"}))
    for demand in (
        share(10, constraints=t4_on_a),
        share(10, memory_mib=20000, constraints=t4_on_a),
    ):
        result = no_fit(view, demand)
        assert view.fitting_elsewhere(demand, result.reason) == (), result.reason


def test_not_now_names_the_left_out_nodes_with_room_now_only() -> None:
    view = ClusterView([node("a", 1), node("b", 1), node("c", 1)])
    for full in ("a", "c"):
        view.allocate(full, [GPUAllocation(f"{full}-gpu0", 100, CARD_MIB)])
    demand = share(10, constraints=Constraints(nodes=frozenset({"a"})))
    result = no_fit(view, demand)
    assert result.reason is NoFitReason.NOT_NOW
    assert view.fitting_elsewhere(demand, result.reason) == ("b",)  # c could, but not now
    view.allocate("b", [GPUAllocation("b-gpu0", 100, CARD_MIB)])
    result = no_fit(view, demand)
    assert view.fitting_elsewhere(demand, result.reason) == ()


def test_a_pod_not_narrowed_by_node_names_no_left_out_node() -> None:
    view = ClusterView([node("a", 1)])
    demand = share(10, memory_mib=20000)
    assert view.fitting_elsewhere(demand, no_fit(view, demand).reason) == ()


def test_a_fully_used_gpu_among_the_best_candidates_says_so() -> None:
    view = ClusterView([node("a", 2)])
    view.allocate("a", [GPUAllocation("a-gpu0", 100, CARD_MIB)])
    view.allocate("a", [GPUAllocation("a-gpu1", 30, 1024)])
    result = no_fit(view, PodDemand((container("train", 100, WHOLE_CARD, gpus=2),)))
    assert result.reason is NoFitReason.NOT_NOW
    assert "a/gpu1 (Tesla T4) has 70 cores and 15360 MiB free" in result.message
    assert "a/gpu0 (Tesla T4) is fully used (node:" in result.message
    assert "0 cores and 0 MiB" not in result.message
