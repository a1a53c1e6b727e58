"""The one rule for whether a container's own spec can set NVIDIA_VISIBLE_DEVICES."""

from typing import Any

import pytest

from fracgpu.model import ContainerAssignment, GPUAllocation
from fracgpu.visible_devices import visible_devices_override, visible_devices_value


@pytest.mark.parametrize(
    ("container", "reason"),
    [
        ({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, "env[0] sets"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "NVIDIA_VISIBLE_DEVICES"}]}, "env[1]"),
        ({"envFrom": [{"configMapRef": {"name": "cm"}}]}, "envFrom[0] has no prefix"),
        ({"envFrom": [{"secretRef": {"name": "s"}, "prefix": ""}]}, "envFrom[0] has no prefix"),
        (
            {"envFrom": [{"prefix": "APP_"}, {"prefix": "NVIDIA_"}]},
            "envFrom[1] has prefix 'NVIDIA_'",
        ),
        ({"envFrom": [{"prefix": "NVIDIA_VISIBLE_DEVICES"}]}, "envFrom[0] has prefix"),
        ({"envFrom": [{"prefix": None}]}, "envFrom[0] has no prefix"),
        ({"envFrom": [None]}, "envFrom[0] has no prefix"),  # unreadable: fail closed
    ],
)
def test_a_spec_that_can_set_the_variable_is_named(container: dict[str, Any], reason: str) -> None:
    assert reason in visible_devices_override(container)


@pytest.mark.parametrize(
    "container",
    [
        {},
        {"env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]},
        {"envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "APP_"}]},
        {"envFrom": [{"prefix": "NVIDIA_VISIBLE_DEVICESX"}]},  # longer than the name
        {"env": "not a list", "envFrom": {"not": "a list"}},
        {"env": [None, 3, {"name": 5}]},
    ],
)
def test_a_spec_that_cannot_set_it_passes(container: dict[str, Any]) -> None:
    assert visible_devices_override(container) == ""


def test_the_value_lists_the_assigned_gpus_in_order() -> None:
    held = ContainerAssignment(
        "main", (GPUAllocation("GPU-b", 100, 1024), GPUAllocation("GPU-a", 100, 1024))
    )
    assert visible_devices_value(held) == "GPU-b,GPU-a"
