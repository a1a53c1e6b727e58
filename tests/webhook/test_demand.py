"""The pod's effective CPU and memory request: the fast paths (containers that ask for
neither, no Fraction arithmetic on zeros) give what the plain Kubernetes rule gives."""

import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracgpu.errors import FracgpuError
from fracgpu.quantity import parse_quantity
from webhook.rules.demand import cpu_and_memory

QUANTITIES = st.sampled_from(["0", "1", "250m", "1500m", "2", "64Mi", "1Gi", "1.5Gi", "100"])


@st.composite
def containers(draw: st.DrawFn, name: str) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    for section in draw(st.sets(st.sampled_from(["limits", "requests"]))):
        keys = draw(st.sets(st.sampled_from(["cpu", "memory", "tencent.com/vcuda-core"])))
        resources[section] = {k: draw(QUANTITIES) for k in keys}
    container: dict[str, Any] = {"name": name, "resources": resources}
    if draw(st.booleans()):
        container["restartPolicy"] = "Always"
    return container


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(1, 3))
    spec: dict[str, Any] = {"containers": [draw(containers(f"c{i}")) for i in range(count)]}
    inits = draw(st.integers(0, 3))
    if inits:
        spec["initContainers"] = [draw(containers(f"i{i}")) for i in range(inits)]
    if draw(st.booleans()):
        keys = draw(st.sets(st.sampled_from(["cpu", "memory"])))
        spec["overhead"] = {k: draw(QUANTITIES) for k in keys}
    return {"spec": spec}


def reference(pod: dict[str, Any]) -> tuple[int, int]:
    """Kubernetes' effective request, spelled out: every container counted, zeros included."""

    def amounts(resources: dict[str, Any]) -> list[Fraction]:
        return [parse_quantity(resources.get(k, 0)) for k in ("cpu", "memory")]

    def asked(container: dict[str, Any]) -> list[Fraction]:
        resources = container.get("resources", {})
        limits = amounts(resources.get("limits", {}))
        requests = resources.get("requests", {})
        values = amounts(requests)
        return [values[i] if k in requests else limits[i] for i, k in enumerate(("cpu", "memory"))]

    spec = pod["spec"]
    app = [Fraction(0)] * 2
    init_peak = [Fraction(0)] * 2
    sidecars = [Fraction(0)] * 2
    for container in spec.get("initContainers", []):
        cpu, memory = asked(container)
        if container.get("restartPolicy") == "Always":
            sidecars = [sidecars[0] + cpu, sidecars[1] + memory]
        else:
            init_peak = [
                max(init_peak[0], sidecars[0] + cpu),
                max(init_peak[1], sidecars[1] + memory),
            ]
    for container in spec["containers"]:
        cpu, memory = asked(container)
        app = [app[0] + cpu, app[1] + memory]
    overhead = amounts(spec.get("overhead", {}))
    cpu_total = max(app[0] + sidecars[0], init_peak[0]) + overhead[0]
    memory_total = max(app[1] + sidecars[1], init_peak[1]) + overhead[1]
    return math.ceil(cpu_total * 1000), math.ceil(memory_total / 2**20)


@settings(max_examples=300, deadline=None)
@given(pods())
def test_effective_request_matches_the_kubernetes_rule(pod: dict[str, Any]) -> None:
    assert cpu_and_memory(pod) == reference(pod)


def test_a_null_cpu_is_refused_not_read_as_zero() -> None:
    pod = {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": None}}}]}}
    with pytest.raises(FracgpuError, match="not a quantity"):
        cpu_and_memory(pod)
