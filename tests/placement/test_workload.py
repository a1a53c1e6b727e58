"""The online workload model: decayed shape frequencies and the typical set."""

import pytest

from fracgpu.model import WHOLE_CARD, MemoryRequest
from fracgpu.placement import ClusterView, Constraints, PodDemand
from fracgpu.placement.workload import (
    DEFAULT_MAX_TRACKED,
    Shape,
    WorkloadModel,
    bucket,
    shape_of,
)
from tests.placement.helpers import container, node, share


def test_shape_of_takes_the_biggest_container_and_constraints() -> None:
    demand = PodDemand(
        (container("small", 10, MemoryRequest(mib=1)), container("big", 100, WHOLE_CARD, gpus=2)),
        cpu_milli=3000,
        memory_mib=512,
        constraints=Constraints(include_models=("T4",)),
    )
    shape = shape_of(demand)
    assert shape is not None
    # CPU and memory are bucketed down to 2 ** (k / 2): 3000 -> 2896, 512 stays.
    assert (shape.units, shape.gpus, shape.cpu_milli, shape.memory_mib) == (100, 2, 2896, 512)
    assert shape.allows_model("Tesla T4") and not shape.allows_model("A100")
    assert shape_of(PodDemand(())) is None


def test_recent_arrivals_weigh_more() -> None:
    model = WorkloadModel(half_life=10)
    old, new = shape_of(share(10)), shape_of(share(20))
    assert old is not None and new is not None
    for _ in range(10):
        model.observe(old)
    for _ in range(10):
        model.observe(new)
    # The ten newer arrivals count twice as much as the ten older ones.
    assert model.frequency(new) / model.frequency(old) == pytest.approx(2.0, rel=1e-9)
    typical = dict(model.typical())
    assert typical[new] == pytest.approx(2 / 3)


def test_typical_covers_the_requested_share_and_rescales() -> None:
    model = WorkloadModel(half_life=1, coverage=0.7)
    a, b, c = (shape_of(share(n)) for n in (10, 20, 30))
    assert a is not None and b is not None and c is not None
    for _ in range(400):  # the increment doubles per arrival: forces rescaling
        model.observe(a)
    for shape in (c, b, c):
        model.observe(shape)
    # Relative weights a : c : b = 1 : (1 + 4) : 2; c alone covers 5/8 < 0.7, c and b 7/8.
    typical = model.typical()
    assert [s for s, _ in typical] == [c, b]
    assert [w for _, w in typical] == pytest.approx([5 / 7, 2 / 7])
    assert model.observations == 403


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"half_life": 0}, "half_life=0"),
        ({"coverage": 0}, "coverage=0"),
        ({"max_shapes": 0}, "max_shapes=0"),
        ({"max_limited_extra": -1}, "max_limited_extra=-1"),
    ],
)
def test_bad_settings(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadModel(**kwargs)  # type: ignore[arg-type]


def test_buckets_round_down_on_a_half_doubling_scale() -> None:
    assert [bucket(v) for v in (0, 1, 3, 4096, 5000, 5792, 5793, 64200)] == [
        0,
        1,
        2,
        4096,
        4096,
        4096,
        5792,
        46340,
    ]


def _shape(demand: PodDemand) -> Shape:
    shape = shape_of(demand)
    assert shape is not None
    return shape


def test_every_pod_counts_once_whatever_its_gpu_count() -> None:
    """One 4-GPU arrival weighs as much as one one-GPU arrival (FGD's frequency by count)."""
    model = WorkloadModel(coverage=1.0, half_life=10**9)
    one, four = _shape(share(100)), _shape(share(100, gpus=4))
    for _ in range(3):
        model.observe(one)
    model.observe(four)
    assert dict(model.typical()) == pytest.approx({one: 0.75, four: 0.25})


def test_typical_shapes_ask_the_most_cpu_and_memory_their_pods_asked() -> None:
    """88,000m rounds down to 65,536m; the typical shape still asks 88,000m, the most any of
    its pods asked, so a node with 70 CPUs free does not look able to host it."""
    model = WorkloadModel()
    demand = share(100, gpus=8, cpu_milli=88000, host_memory_mib=300000)
    shape = _shape(demand)
    assert shape.cpu_milli == 65536
    model.observe(shape, 88000, 300000)
    model.observe(shape, 70000, 310000)
    (typical, _), *_ = model.typical()
    assert (typical.cpu_milli, typical.memory_mib) == (88000, 310000)


def test_multi_gpu_shapes_stay_typical_past_the_coverage_cut() -> None:
    model = WorkloadModel(coverage=0.95)
    small, whole_node = _shape(share(30)), _shape(share(100, gpus=8))
    for _ in range(990):
        model.observe(small)
    for _ in range(3):  # 0.3 % of the arrivals
        model.observe(whole_node)
    assert [s.gpus for s, _ in model.typical()] == [1, 8]
    fgd_like = WorkloadModel(coverage=0.95, keep_wide=False)
    for _ in range(990):
        fgd_like.observe(small)
    for _ in range(3):
        fgd_like.observe(whole_node)
    assert [s.gpus for s, _ in fgd_like.typical()] == [1]


def _flood(count: int) -> list[PodDemand]:
    """``count`` pods of distinct shapes (the review's attack: a new GPU memory and a new
    avoided model each)."""
    return [
        share(10, 1024 + i, constraints=Constraints(exclude_models=(f"m{i}",)))
        for i in range(count)
    ]


def test_the_model_tracks_a_bounded_number_of_shapes() -> None:
    """Every arriving pod is observed, refused ones too: distinct shapes must not grow the
    model without bound. Past twice the bound, the lightest shapes are forgotten down to it;
    a shape as frequent as one arrival in ten outweighs the flood and stays typical."""
    flood = [
        Shape(10, 1, MemoryRequest(mib=1024 + i), 0, 0, exclude_models=(f"m{i}",))
        for i in range(100_000)
    ]
    common = _shape(share(30))
    for model in (WorkloadModel(), WorkloadModel(half_life=10**12, keep_wide=False)):
        most = 0
        for i, shape in enumerate(flood):
            model.observe(shape)
            if i % 10 == 0:
                model.observe(common)
            most = max(most, len(model._weights), len(model._largest))
        assert most <= 2 * DEFAULT_MAX_TRACKED
        assert set(model._largest) == set(model._weights)
        (first, _), *_ = model.typical()
        assert first == common


def test_shapes_limited_to_models_get_room_past_the_bound() -> None:
    """Limited pods split into many light shapes; past ``max_shapes`` only they may join
    (up to ``max_limited_extra``), so a workload with no limited pods scores no more shapes."""
    t4 = Constraints(include_models=("T4",))
    anywhere = [_shape(share(10 + i)) for i in range(3)]
    limited = [
        _shape(PodDemand((container("c", 20 + i, MemoryRequest(mib=1)),), constraints=t4))
        for i in range(3)
    ]
    counts = list(zip((9, 8, 7, 3, 2, 1), [*anywhere, *limited], strict=True))

    def typical(**kwargs: int) -> list[Shape]:
        model = WorkloadModel(max_shapes=2, coverage=1.0, half_life=10**12, **kwargs)
        for count, shape in counts:
            for _ in range(count):
                model.observe(shape)
        return [s for s, _ in model.typical()]

    assert typical(max_limited_extra=0) == anywhere[:2]
    # The third shape any model can take is passed over; the two heaviest limited ones join.
    assert typical(max_limited_extra=2) == [*anywhere[:2], *limited[:2]]
    # Limited shapes lighter than LIMITED_MIN_SHARE of the arrivals do not (one-offs).
    counts[0] = (20_000, anywhere[0])
    assert typical(max_limited_extra=2) == anywhere[:2]


def test_a_small_bound_keeps_the_heaviest_shapes() -> None:
    model = WorkloadModel(max_shapes=2, max_tracked=2, half_life=10**12)
    shapes = [_shape(share(10 + i)) for i in range(5)]
    for count, shape in zip((5, 4, 1, 1, 1), shapes, strict=True):
        for _ in range(count):
            model.observe(shape)
    # The fifth shape passed 2 x 2: pruned to the two heaviest.
    assert set(model._weights) == set(model._largest) == set(shapes[:2])
    with pytest.raises(ValueError, match="max_tracked=0"):
        WorkloadModel(max_tracked=0)


def test_the_view_bounds_both_workload_models() -> None:
    """The fragmentation policy's shapes and FGD's task types, as ``ClusterView.observe``
    keeps them."""
    view = ClusterView([node("n", 1)])
    for demand in _flood(20_000):
        view.observe(demand)
    for model in (view._workload, view._fgd_workload):
        assert len(model._weights) <= 2 * DEFAULT_MAX_TRACKED
        assert set(model._largest) == set(model._weights)
