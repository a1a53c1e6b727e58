"""ResourceNames says which of its names are shared, for the message that refuses them."""

from fracgpu.dialects import ResourceNames


def test_distinct_names_share_nothing() -> None:
    assert dict(ResourceNames().shared()) == {}


def test_each_shared_name_lists_its_fields_in_declaration_order() -> None:
    names = ResourceNames(
        vcuda_core="nvidia.com/gpu", gpushare_mem="a.io/x", gpushare_count="a.io/x"
    )
    assert dict(names.shared()) == {
        "nvidia.com/gpu": ("vcuda_core", "hami_gpu"),
        "a.io/x": ("gpushare_mem", "gpushare_count"),
    }
    three = ResourceNames(vcuda_memory="t.io/m", hami_gpumem="t.io/m", hami_priority="t.io/m")
    assert dict(three.shared()) == {"t.io/m": ("vcuda_memory", "hami_gpumem", "hami_priority")}
