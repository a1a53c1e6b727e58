"""Device IDs and the preferred allocation."""

import dataclasses

from agent.deviceplugin.units import ResourceKind, advertised_units, gpu_of, preferred, unit_id
from agent.nodesettings import memory_scaling_of
from tests.agent.conftest import GPU_A, GPU_B

CORE = ResourceKind.COMPUTE


def test_ids_round_trip_to_their_gpu() -> None:
    assert gpu_of(CORE, unit_id(CORE, GPU_A.uuid, 42)) == GPU_A.uuid
    assert gpu_of(CORE, "GPU-x-mem-1") is None
    assert gpu_of(ResourceKind.MEMORY, "GPU-x-mem-1") == "GPU-x"


def test_mig_gpus_are_not_advertised() -> None:
    mig = dataclasses.replace(GPU_B, mig_enabled=True)
    units = advertised_units(CORE, [GPU_A, mig], {})
    assert {u.uuid for u in units} == {GPU_A.uuid}


def test_preferred_keeps_required_ids_and_fills_their_gpu_first() -> None:
    a = [unit_id(CORE, GPU_A.uuid, n) for n in range(100)]
    b = [unit_id(CORE, GPU_B.uuid, n) for n in range(40)]  # B is fuller
    must = [unit_id(CORE, GPU_A.uuid, 7)]
    chosen = preferred(CORE, a + b, must, 20)
    assert chosen[0] == must[0] and len(chosen) == 20 and len(set(chosen)) == 20
    assert all(gpu_of(CORE, d) == GPU_A.uuid for d in chosen)
    # with nothing required, the fullest GPU (fewest free IDs) is packed first
    chosen = preferred(CORE, a + b, [], 30)
    assert all(gpu_of(CORE, d) == GPU_B.uuid for d in chosen)
    # spills over to the next GPU when one is not enough
    chosen = preferred(CORE, a + b, [], 50)
    assert sum(gpu_of(CORE, d) == GPU_B.uuid for d in chosen) == 40


def test_memory_scaling_multiplies_memory_ids_not_compute_ids() -> None:
    memory = ResourceKind.MEMORY
    plain = advertised_units(memory, [GPU_A], {})
    scaled = advertised_units(memory, [GPU_A], {}, memory_scaling=1.5)
    assert len(plain) == GPU_A.memory_mib // 256
    assert len(scaled) == int(GPU_A.memory_mib * 1.5) // 256
    assert len(advertised_units(CORE, [GPU_A], {}, memory_scaling=1.5)) == 100


def test_node_memory_scaling_reads_the_spec_or_falls_back() -> None:
    assert memory_scaling_of({}, 1.5) == 1.5
    assert memory_scaling_of({"memoryScaling": 2}, 1.5) == 2.0
    assert memory_scaling_of({"memoryScaling": 0.2}, 1.5) == 1.5  # unusable: the default
    assert memory_scaling_of({"memoryScaling": "x"}, 1.5) == 1.5
