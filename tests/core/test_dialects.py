from typing import Any

import pytest

from fracgpu.dialects import (
    DialectConfig,
    ResourceNames,
    canonical_quantities,
    gpu_resource_values,
    parse_container,
    with_pod_core_limit,
)
from fracgpu.errors import FracgpuError, RequestError
from fracgpu.model import (
    WHOLE_CARD,
    ContainerAssignment,
    ContainerRequest,
    Dialect,
    GPUAllocation,
    MemoryRequest,
    Priority,
)

CONFIG = DialectConfig()


def container(limits: dict[str, Any], requests: dict[str, Any] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": limits}
    if requests is not None:
        resources["requests"] = requests
    return {"name": "infer", "image": "cuda", "resources": resources}


def mib(value: int) -> MemoryRequest:
    return MemoryRequest(mib=value)


TK = Dialect.TKESTACK
HAMI = Dialect.HAMI
SHARE = Dialect.GPUSHARE


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        # TKEStack: a share of one GPU, whole GPUs, memory in 256 MiB blocks
        ({"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "8"}, (1, 30, mib(2048), TK)),
        ({"tencent.com/vcuda-core": "99", "tencent.com/vcuda-memory": "1"}, (1, 99, mib(256), TK)),
        ({"tencent.com/vcuda-core": "100"}, (1, 100, WHOLE_CARD, TK)),
        (
            {"tencent.com/vcuda-core": "300", "tencent.com/vcuda-memory": "4"},
            (3, 100, WHOLE_CARD, TK),
        ),
        ({"tencent.com/vcuda-core": "50"}, (1, 50, WHOLE_CARD, TK)),  # default memory
        ({"tencent.com/vcuda-memory": "4"}, (1, 0, mib(1024), TK)),  # default cores and count
        # HAMi: GPUs, gpumem MiB per GPU (rounded up to blocks), percentage, cores
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"},
            (1, 30, mib(3072), HAMI),
        ),
        (
            {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50"},
            (2, 0, MemoryRequest(percent=50), HAMI),
        ),
        ({"nvidia.com/gpu": "1"}, (1, 0, WHOLE_CARD, HAMI)),
        (
            {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "100", "nvidia.com/gpumem": "1024"},
            (2, 100, WHOLE_CARD, HAMI),
        ),
        ({"nvidia.com/gpumem": "1024"}, (1, 0, mib(1024), HAMI)),
        # gpushare: memory in GiB, count
        ({"aliyun.com/gpu-mem": "3"}, (1, 0, mib(3072), SHARE)),
        ({"aliyun.com/gpu-mem": "2", "aliyun.com/gpu-count": "2"}, (2, 0, mib(2048), SHARE)),
    ],
)
def test_dialects_normalise(limits: dict[str, Any], expected: tuple[Any, ...]) -> None:
    gpus, cores, memory, dialect = expected
    request = parse_container(container(limits), CONFIG)
    assert request == ContainerRequest("infer", gpus, cores, memory, dialect)


def test_no_gpu_resources_is_not_a_gpu_container() -> None:
    assert parse_container(container({"cpu": "1", "memory": "1Gi"}), CONFIG) is None
    assert parse_container({"name": "x"}, CONFIG) is None
    # HAMi spells "no GPU" as nvidia.com/gpu: 0 (alone; with gpumem etc. it is an error)
    assert parse_container(container({"nvidia.com/gpu": "0"}), CONFIG) is None


def test_requests_equal_to_limits_are_accepted() -> None:
    limits = {"tencent.com/vcuda-core": "20", "tencent.com/vcuda-memory": "2"}
    request = parse_container(container(limits, dict(limits)), CONFIG)
    assert request is not None and request.cores == 20


def test_core_limit_is_an_elastic_bound() -> None:
    limits = {
        "tencent.com/vcuda-core": "20",
        "tencent.com/vcuda-memory": "2",
        "tencent.com/vcuda-core-limit": "60",
    }
    request = parse_container(container(limits), CONFIG)
    assert request is not None and (request.cores, request.core_limit) == (20, 60)


CORE_RANGE = (
    "use a whole number 1-99 for a share of one GPU, or a multiple of 100 up to 6400 for whole GPUs"
)
BLOCKS_RANGE = "use a whole number 1-65536: blocks of 256 MiB"
HAMI_GPU_RANGE = "use a whole number 0-64: GPUs (0 asks for none)"

REJECTIONS = [
    (
        {"tencent.com/vcuda-core": "150"},
        f'container "infer": tencent.com/vcuda-core=150 is not allowed: {CORE_RANGE}',
    ),
    (
        {"tencent.com/vcuda-core": "0", "tencent.com/vcuda-memory": "1"},
        f'container "infer": tencent.com/vcuda-core=0 is not allowed: {CORE_RANGE}',
    ),
    ({"tencent.com/vcuda-core": "-5"}, f"tencent.com/vcuda-core=-5 is not allowed: {CORE_RANGE}"),
    (
        {"tencent.com/vcuda-core": "500m"},
        f"tencent.com/vcuda-core=500m is not allowed: {CORE_RANGE}",
    ),
    (
        {"tencent.com/vcuda-core": "1e400"},
        f"tencent.com/vcuda-core=1e400 is not allowed: {CORE_RANGE}",
    ),
    ({"tencent.com/vcuda-core": "NaN"}, f"tencent.com/vcuda-core=NaN is not allowed: {CORE_RANGE}"),
    ({"tencent.com/vcuda-core": "10Q"}, f"tencent.com/vcuda-core=10Q is not allowed: {CORE_RANGE}"),
    (
        {"tencent.com/vcuda-core": "99999999999999999999999"},
        f"tencent.com/vcuda-core=99999999999999999999999 is not allowed: {CORE_RANGE}",
    ),
    (
        {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "0"},
        f"tencent.com/vcuda-memory=0 is not allowed: {BLOCKS_RANGE}",
    ),
    (
        {"tencent.com/vcuda-core": "6500"},
        f"tencent.com/vcuda-core=6500 is not allowed: {CORE_RANGE}",
    ),
    (
        {"tencent.com/vcuda-core": "200", "tencent.com/vcuda-core-limit": "100"},
        "tencent.com/vcuda-core-limit=100 is not allowed: remove it: whole GPUs have no "
        "upper bound",
    ),
    (
        {"tencent.com/vcuda-core": "40", "tencent.com/vcuda-core-limit": "30"},
        "tencent.com/vcuda-core-limit=30 is not allowed: use a whole number 40-100",
    ),
    (
        {"tencent.com/vcuda-core-limit": "30"},
        "tencent.com/vcuda-core-limit=30 is not allowed: set tencent.com/vcuda-core as well",
    ),
    (
        {"nvidia.com/gpu": "0", "nvidia.com/gpumem": "100"},
        "nvidia.com/gpu=0 is not allowed: use a whole number 1-64 when nvidia.com/gpumem is set",
    ),
    ({"nvidia.com/gpu": "65"}, f"nvidia.com/gpu=65 is not allowed: {HAMI_GPU_RANGE}"),
    (
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100", "nvidia.com/gpumem-percentage": "5"},
        "set either nvidia.com/gpumem (MiB) or nvidia.com/gpumem-percentage, not both",
    ),
    (
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "101"},
        "nvidia.com/gpumem-percentage=101 is not allowed: use a whole number 1-100: percent of "
        "each GPU's memory",
    ),
    (
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0"},
        "nvidia.com/gpumem=0 is not allowed: use a whole number 1-16777216: MiB per GPU",
    ),
    (
        {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "120"},
        "nvidia.com/gpucores=120 is not allowed: use a whole number 0-100: percent of each "
        "GPU's compute",
    ),
    (
        {"aliyun.com/gpu-mem": "0"},
        "aliyun.com/gpu-mem=0 is not allowed: use a whole number 1-16384: GiB per GPU",
    ),
    (
        {"aliyun.com/gpu-mem": "1", "aliyun.com/gpu-count": "0"},
        "aliyun.com/gpu-count=0 is not allowed: use a whole number 1-64: GPUs",
    ),
    (
        {"tencent.com/vcuda-core": "10", "nvidia.com/gpumem": "100"},
        "resources=nvidia.com/gpumem,tencent.com/vcuda-core is not allowed: use one dialect per "
        "container",
    ),
]


@pytest.mark.parametrize(("limits", "message"), REJECTIONS)
def test_rejections_name_container_field_value_and_what_is_allowed(
    limits: dict[str, Any], message: str
) -> None:
    with pytest.raises(RequestError) as info:
        parse_container(container(limits), CONFIG)
    assert message in str(info.value)
    assert str(info.value).startswith('container "infer": ')


def refusal(limits: dict[str, Any], requests: dict[str, Any] | None = None) -> str:
    with pytest.raises(RequestError) as info:
        parse_container(container(limits, requests), CONFIG)
    return str(info.value)


def test_a_refusal_echoes_the_value_as_written_with_the_range_of_its_resource() -> None:
    # Once: '16Gi' came back as 17179869184, and -1 was told "0 or more", then 0 "1-65536".
    blocks = f"is not allowed: {BLOCKS_RANGE}"
    for written in ("16Gi", "-1", "0", "2.5", "1500m", "lots", 2.5, -1):
        assert refusal({"tencent.com/vcuda-memory": written}) == (
            f'container "infer": tencent.com/vcuda-memory={written} {blocks}'
        ), written
    assert refusal({"tencent.com/vcuda-core": 30.5}) == (
        f'container "infer": tencent.com/vcuda-core=30.5 is not allowed: {CORE_RANGE}'
    )
    assert refusal({"nvidia.com/gpu": "-1"}).endswith(f"=-1 is not allowed: {HAMI_GPU_RANGE}")
    mismatch = refusal({"tencent.com/vcuda-memory": "1Ki"}, {"tencent.com/vcuda-memory": "2Ki"})
    assert (
        "requests[tencent.com/vcuda-memory]=2Ki is not allowed: make the request equal the "
        "limit 1Ki" in mismatch
    )


def test_a_refusal_echoes_a_bounded_part_of_hostile_values() -> None:
    for hostile, shown in (
        ("9" * 100_000, "9" * 64 + "..."),
        ({"a": "b" * 100_000}, "(a mapping)"),
        (["x"] * 100_000, "(a list)"),
        (10**100_000, "(a 332193-bit number)"),
        (None, "null"),
        (True, "true"),
    ):
        assert refusal({"nvidia.com/gpu": hostile}) == (
            f'container "infer": nvidia.com/gpu={shown} is not allowed: {HAMI_GPU_RANGE}'
        )
        assert refusal({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": hostile}) == (
            f'container "infer": requests[nvidia.com/gpu]={shown} is not allowed: {HAMI_GPU_RANGE}'
        )


def test_yaml_numbers_that_are_whole_count_as_kubernetes_reads_them() -> None:
    # Unquoted in YAML, 2.0 is a float; kubectl sends it and the API server reads quantity 2.
    request = parse_container(
        container(
            {"tencent.com/vcuda-core": 30.0, "tencent.com/vcuda-memory": 2.0},
            {"tencent.com/vcuda-core": "30"},
        ),
        CONFIG,
    )
    assert request == ContainerRequest("infer", 1, 30, mib(512))


def test_request_must_equal_limit() -> None:
    c = container({"tencent.com/vcuda-core": "20"}, {"tencent.com/vcuda-core": "10"})
    with pytest.raises(RequestError, match="make the request equal the limit 20"):
        parse_container(c, CONFIG)


def test_request_without_limit_is_rejected() -> None:
    c = container({}, {"nvidia.com/gpu": "1"})
    with pytest.raises(RequestError, match=r"requests\[nvidia.com/gpu\]=1 is not allowed: set it"):
        parse_container(c, CONFIG)


def test_malformed_resources_are_rejected_not_crashed() -> None:
    with pytest.raises(RequestError, match="resources=list is not allowed: use a mapping"):
        parse_container({"name": "a", "resources": ["x"]}, CONFIG)
    with pytest.raises(RequestError, match=r"resources\.limits=str is not allowed"):
        parse_container({"name": "a", "resources": {"limits": "x"}}, CONFIG)


def test_defaults_come_from_configuration() -> None:
    config = DialectConfig(default_cores=25, default_memory=MemoryRequest(mib=512))
    request = parse_container(container({"nvidia.com/gpu": "1"}), config)
    assert request == ContainerRequest("infer", 1, 25, MemoryRequest(mib=512), HAMI)


def test_gpushare_unit_can_be_mib() -> None:
    config = DialectConfig(gpushare_memory_unit_mib=1)
    request = parse_container(container({"aliyun.com/gpu-mem": "1000"}), config)
    assert request is not None and request.memory == mib(1024)


def test_resource_names_are_configurable() -> None:
    config = DialectConfig(names=ResourceNames(vcuda_core="example.com/core"))
    # The stock name is not this cluster's any more: refused, not taken for "no GPU".
    with pytest.raises(RequestError, match=r"example\.com/core"):
        parse_container(container({"tencent.com/vcuda-core": "30"}), config)
    request = parse_container(container({"example.com/core": "30"}), config)
    assert request is not None and request.cores == 30


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="default_cores=101"):
        DialectConfig(default_cores=101)
    with pytest.raises(ValueError, match="gpushare_memory_unit_mib"):
        DialectConfig(gpushare_memory_unit_mib=7)


def test_gpu_resource_values_ignores_other_resources() -> None:
    c = container({"cpu": "2", "nvidia.com/gpu": "1"})
    assert gpu_resource_values(c, CONFIG) == {"nvidia.com/gpu": "1"}


def test_canonical_quantities_sum_cores_and_blocks() -> None:
    assigned = ContainerAssignment(
        "infer", (GPUAllocation("GPU-a", 100, 16384), GPUAllocation("GPU-b", 100, 16384))
    )
    assert canonical_quantities(assigned) == {
        "tencent.com/vcuda-core": "200",
        "tencent.com/vcuda-memory": "128",
    }


def test_memory_percentage_resolves_per_card() -> None:
    assert MemoryRequest(percent=50).resolve(15360) == 7680
    assert MemoryRequest(percent=100).resolve(23028) == 23028
    assert MemoryRequest(percent=1).resolve(1024) == 256  # never below one block
    with pytest.raises(ValueError, match="exactly one"):
        MemoryRequest()


# -- HAMi's per-container priority limit ----------------------------------------------------------
@pytest.mark.parametrize(("value", "priority"), [("0", Priority.HIGH), ("1", Priority.LOW)])
def test_hami_priority_limit_is_the_containers_priority(value: str, priority: Priority) -> None:
    request = parse_container(
        container(
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/priority": value}
        ),
        CONFIG,
    )
    assert request is not None and request.priority is priority


def test_priority_alone_asks_for_no_gpu() -> None:
    assert parse_container(container({"nvidia.com/priority": "0"}), CONFIG) is None


@pytest.mark.parametrize(
    ("limits", "requests", "message"),
    [
        ({"nvidia.com/priority": "2"}, None, "nvidia.com/priority=2 is not allowed: use 0 (high"),
        ({"nvidia.com/priority": "x"}, None, "nvidia.com/priority=x is not allowed"),
        (
            {"nvidia.com/priority": "0"},
            {"nvidia.com/priority": "1"},
            "make the request equal the limit 0",
        ),
    ],
)
def test_bad_hami_priorities_are_refused(
    limits: dict[str, str], requests: dict[str, str] | None, message: str
) -> None:
    with pytest.raises(RequestError) as info:
        parse_container(container({"nvidia.com/gpu": "1", **limits}, requests), CONFIG)
    assert message in str(info.value)


# -- TKEStack's pod annotation vcuda-core-limit ---------------------------------------------------
def _tk(name: str, cores: int, **extra: str) -> ContainerRequest:
    request = parse_container(
        {
            "name": name,
            "resources": {
                "limits": {"tencent.com/vcuda-core": str(cores), "tencent.com/vcuda-memory": "4"}
                | extra
            },
        },
        CONFIG,
    )
    assert request is not None
    return request


def test_the_pod_annotation_bounds_every_shared_tkestack_container() -> None:
    requests = (_tk("a", 20), _tk("b", 30, **{"tencent.com/vcuda-core-limit": "40"}), _tk("c", 100))
    bounded = with_pod_core_limit(requests, {"tencent.com/vcuda-core-limit": "70"}, CONFIG)
    assert [r.core_limit for r in bounded] == [70, 40, None]  # own bound wins; whole GPU: none


def test_without_the_annotation_nothing_changes() -> None:
    requests = (_tk("a", 20),)
    assert with_pod_core_limit(requests, {}, CONFIG) == requests


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "annotation tencent.com/vcuda-core-limit='abc' is not allowed: use a whole number"),
        ("0", "use a whole number 1-100"),
        ("101", "use a whole number 1-100"),
        (
            "10",
            'container "a": annotation tencent.com/vcuda-core-limit=10 is not allowed: use a whole '
            "number 20-100",
        ),
    ],
)
def test_bad_pod_core_limits_are_refused(value: str, message: str) -> None:
    with pytest.raises(FracgpuError) as info:
        with_pod_core_limit((_tk("a", 20),), {"tencent.com/vcuda-core-limit": value}, CONFIG)
    assert message in str(info.value)


# The HAMi profile's names (charts/fracgpu/values-hami.yaml): TKEStack units renamed.
RENAMED = DialectConfig(
    names=ResourceNames(
        vcuda_core="fracgpu.io/vcuda-core",
        vcuda_memory="fracgpu.io/vcuda-memory",
        vcuda_core_limit="fracgpu.io/vcuda-core-limit",
    )
)


@pytest.mark.parametrize(
    ("config", "key", "meant"),
    [
        # misspellings that would be admitted as "no GPU" and then never be scheduled
        (CONFIG, "tencent.com/vcuda-cores", "tencent.com/vcuda-core"),
        (CONFIG, "tencent.com/vcuda-mem", "tencent.com/vcuda-memory"),
        (CONFIG, "nvidia.com/gpu-mem", "nvidia.com/gpumem"),
        (CONFIG, "nvidia.com/gpucore", "nvidia.com/gpucores"),
        (CONFIG, "aliyun.com/gpu-memory", "aliyun.com/gpu-mem"),
        (CONFIG, "fracgpu.io/vcuda-core", "tencent.com/vcuda-core"),
        # a dialect's stock names where the cluster renamed them (the HAMi profile)
        (RENAMED, "tencent.com/vcuda-core", "fracgpu.io/vcuda-core"),
        (RENAMED, "tencent.com/vcuda-memory", "fracgpu.io/vcuda-memory"),
    ],
)
def test_a_lookalike_of_a_gpu_resource_is_refused_with_the_name_meant(
    config: DialectConfig, key: str, meant: str
) -> None:
    with pytest.raises(RequestError) as error:
        parse_container(container({key: "1"}), config)
    message = str(error.value)
    assert f"limits[{key}]=1" in message and f"(did you mean {meant}?)" in message
    assert config.names.vcuda_core in message  # the cluster's own names are listed
    # The same key asked only under requests is refused the same way.
    with pytest.raises(RequestError, match=rf"requests\[{key}\]"):
        parse_container({"name": "c", "resources": {"requests": {key: "1"}}}, config)


def test_a_huge_lookalike_key_is_quoted_and_compared_only_in_part() -> None:
    """The attack: one key of a megabyte, compared character by character against every
    name (quadratic) and echoed whole in the denial."""
    key = "tencent.com/vcuda-" + "x" * (1 << 20)
    with pytest.raises(RequestError) as error:
        parse_container(container({key: "1"}), CONFIG)
    assert len(str(error.value)) < 1500
    assert "(did you mean tencent.com/vcuda-" in str(error.value)


@pytest.mark.parametrize(
    "key",
    [
        "nvidia.com/gpu.shared",  # NVIDIA's time-slicing plugin, renamed resource
        "nvidia.com/mig-1g.10gb",
        "aliyun.com/gpu-core.percentage",  # Alibaba cGPU
        "example.com/vcuda-core",
        "hugepages-2Mi",
        "ephemeral-storage",
    ],
)
def test_other_plugins_resources_are_left_alone(key: str) -> None:
    assert parse_container(container({key: "1", "cpu": "1"}), CONFIG) is None
    assert parse_container(container({key: "1"}), RENAMED) is None
