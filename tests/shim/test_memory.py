"""Memory slice: every allocation path counts, exactly, through every lookup."""

from __future__ import annotations

import pytest

from tests.shim.memory_scripts import SCRIPTS, Script, results
from tests.shim.sandbox import GiB, MiB, Sandbox, step, steps

LOOKUPS = ["direct", "dlsym", "procaddr", "procaddr_ptds"]
OOM = "2"


def run_script(node: Sandbox, script: Script, lookup: str = "direct") -> None:
    """A shared script (tests/shim/memory_scripts.py) on the double's 1 GiB slice: exact."""
    out = node.run("mem_ops", *script.args(1), lookup=lookup)
    assert out.returncode == 0, out.stdout + out.stderr
    script.check(out.stdout, 1, 0)


@pytest.mark.parametrize("lookup", LOOKUPS)
def test_slice_is_enforced_exactly(node: Sandbox, lookup: str) -> None:
    out = node.run(
        "mem_ops",
        "ctx",
        "0",
        "alloc",
        "512Mi",
        "alloc",
        "512Mi",
        "alloc",
        "1",
        "info",
        "free",
        "0",
        "info",
        "alloc",
        "512Mi",
        "wait",
        lookup=lookup,
        timeout=30,
    )
    s = steps(out.stdout)
    assert out.returncode == 0, out.stderr
    assert [x[:2] for x in s if x[0] == "alloc"] == [
        ["alloc", "0"],
        ["alloc", "0"],
        ["alloc", OOM],
        ["alloc", "0"],
    ]
    assert step(out.stdout, "info", 0)[1:] == ["0", "0", str(GiB)]
    assert step(out.stdout, "info", 1)[1:] == ["0", str(512 * MiB), str(GiB)]
    device = node.region().devices[0]
    assert device.oom_rejections == 1
    assert device.memory_peak == GiB


def test_without_the_shim_the_whole_device_is_visible(node: Sandbox) -> None:
    out = node.run("mem_ops", "ctx", "0", "alloc", "2Gi", "info", preload=None)
    assert step(out.stdout, "alloc")[1] == "0"
    assert step(out.stdout, "info")[3] == str(4 * GiB)


def test_total_mem_reports_the_slice(node: Sandbox) -> None:
    out = node.run("mem_ops", "ctx", "0", "total", "0")
    assert step(out.stdout, "total")[1:] == ["0", str(GiB)]


def test_fill_stops_at_the_slice_and_free_gives_all_back(node: Sandbox) -> None:
    out = node.run("mem_ops", "ctx", "0", "fill", "100Mi", "info")
    assert step(out.stdout, "fill")[1:] == [OOM, "10"]
    assert step(out.stdout, "info")[2] == str(GiB - 1000 * MiB)


@pytest.mark.parametrize("kind", ["managed", "async", "pool"])
def test_other_linear_allocations_count(node: Sandbox, kind: str) -> None:
    run_script(node, SCRIPTS[kind])


def test_pitch_counts_what_the_driver_gave(node: Sandbox) -> None:
    out = node.run("mem_ops", "ctx", "0", "pitch", "1000", "1000", "wait", timeout=10)
    assert step(out.stdout, "pitch")[1] == "0"
    pitch = int(step(out.stdout, "pitch")[3])
    assert pitch == 1024
    out = node.run("mem_ops", "ctx", "0", "pitch", "1000", "1000", "info")
    assert step(out.stdout, "info")[2] == str(GiB - 1024 * 1000)


def test_virtual_memory_create_and_release(node: Sandbox) -> None:
    run_script(node, SCRIPTS["vmm-create-release"])


def test_arrays_and_mipmaps_count_and_release(node: Sandbox) -> None:
    # float4 1024x1024 = 16 MiB; 3D uint8 256^3 = 16 MiB; mipmap levels 256^3 + 128^3
    out = node.run(
        "mem_ops",
        "ctx",
        "0",
        "array",
        "1024",
        "1024",
        "info",
        "array3d",
        "256",
        "256",
        "256",
        "info",
        "mipmap",
        "256",
        "256",
        "256",
        "2",
        "info",
        "adestroy",
        "0",
        "adestroy",
        "1",
        "mdestroy",
        "2",
        "info",
    )
    free = [int(x[2]) for x in steps(out.stdout) if x[0] == "info"]
    assert free == [GiB - 16 * MiB, GiB - 32 * MiB, GiB - 48 * MiB - 2 * MiB, GiB]


def test_context_overhead_counts(tmp_path: object, node: Sandbox) -> None:
    node.context_bytes = 256 * MiB
    node.write_fake_config()
    node.write_limits(context_overhead_bytes=256 * MiB)
    out = node.run(
        "mem_ops",
        "ctx",
        "0",
        "info",
        "ctxcreate",
        "0",
        "info",
        "alloc",
        "100Mi",
        "info",
        "ctxdestroy",
        "0",
        "setctx",
        "0",
        "info",
    )
    assert step(out.stdout, "ctxcreate")[1] == "0"
    free = [int(x[2]) for x in steps(out.stdout) if x[0] == "info"]
    assert free[:3] == [768 * MiB, 512 * MiB, 412 * MiB]


def test_destroying_a_context_releases_its_allocations(node: Sandbox) -> None:
    out = node.run(
        "mem_ops",
        "ctx",
        "0",
        "ctxcreate",
        "0",
        "alloc",
        "800Mi",
        "ctxdestroy",
        "0",
        "ctx",
        "0",
        "alloc",
        "800Mi",
    )
    assert [x[1] for x in steps(out.stdout) if x[0] == "alloc"] == ["0", "0"]


def test_primary_context_reset_releases_its_allocations(node: Sandbox) -> None:
    out = node.run(
        "mem_ops", "ctx", "0", "alloc", "800Mi", "primary_reset", "0", "ctx", "0", "alloc", "800Mi"
    )
    assert [x[1] for x in steps(out.stdout) if x[0] == "alloc"] == ["0", "0"]


def test_failed_driver_allocation_returns_the_reservation(node: Sandbox) -> None:
    node.device_memory = 512 * MiB  # the real GPU is fuller than the slice
    node.write_fake_config()
    out = node.run("mem_ops", "ctx", "0", "alloc", "600Mi", "info", "alloc", "400Mi")
    assert [x[1] for x in steps(out.stdout) if x[0] == "alloc"] == [OOM, "0"]
    assert step(out.stdout, "info")[2] == str(512 * MiB)


def test_device_without_limits_gets_no_memory(node: Sandbox) -> None:
    node.device_count = 2
    node.write_fake_config()
    out = node.run("mem_ops", "ctx", "0", "ctx", "1", "alloc", "1Mi")
    assert [x[1] for x in steps(out.stdout) if x[0] == "ctx"] == ["0", OOM]
    assert "CUDA device 1" in out.stderr and "not in the limits file" in out.stderr


def test_two_devices_have_separate_slices(node: Sandbox) -> None:
    node.device_count = 2
    node.write_fake_config()
    node.write_limits(devices=2)
    out = node.run("mem_ops", "ctx", "0", "alloc", "1Gi", "ctx", "1", "alloc", "1Gi", "alloc", "1")
    assert [x[1] for x in steps(out.stdout) if x[0] == "alloc"] == ["0", "0", OOM]


def test_many_threads_churning_leave_nothing_counted(node: Sandbox) -> None:
    out = node.run("mem_ops", "ctx", "0", "threads", "8", "2000", "100Mi", "info")
    assert step(out.stdout, "threads")[1] == "0"
    assert step(out.stdout, "info")[2] == str(GiB)


def test_threads_racing_to_fill_never_pass_the_slice(node: Sandbox) -> None:
    out = node.run("mem_ops", "ctx", "0", "tfill", "8", "10Mi", "wait", timeout=30)
    got, count = step(out.stdout, "tfill")[1:]
    assert int(count) == GiB // (10 * MiB)
    assert int(got) == int(count) * 10 * MiB


@pytest.mark.parametrize("lookup", ["direct", "dlsym", "procaddr"])
@pytest.mark.parametrize("op", ["primary_release_v1", "primary_reset_v1"])
def test_pre_11_primary_context_entry_points_give_the_memory_back(
    node: Sandbox, lookup: str, op: str
) -> None:
    # cuDevicePrimaryCtxRelease/Reset (superseded by _v2 in CUDA 11.0, still exported,
    # and what cuGetProcAddress returns for a cudaVersion below 11000) free the
    # context and everything in it: the slice must see that, or the container is
    # refused memory it no longer holds.
    out = node.run(
        "mem_ops", "ctx", "0", "alloc", "512Mi", op, "0", "ctx", "0", "alloc", "1000Mi", "info",
        lookup=lookup,
    )  # fmt: skip
    assert step(out.stdout, op)[1] == "0", out.stdout + out.stderr
    assert step(out.stdout, "alloc", 1)[1] == "0", out.stdout
    assert step(out.stdout, "info")[2] == str(GiB - 1000 * MiB)


@pytest.mark.parametrize("lookup", ["direct", "procaddr"])
def test_a_released_handle_counts_until_its_last_mapping_goes(node: Sandbox, lookup: str) -> None:
    run_script(node, SCRIPTS["vmm-released-while-mapped"], lookup=lookup)


def test_context_limits_count_against_the_slice(node: Sandbox) -> None:
    # cuCtxSetLimit makes the driver allocate outside cuMemAlloc: the malloc heap and
    # printf FIFO as set, the stack for every resident thread (the double: 16
    # multiprocessors x 2048 threads). Beyond the defaults it counts; lowering gives back.
    out = node.run(
        "mem_ops", "ctx", "0",
        "setlimit", "2", "900Mi",  # malloc heap: 892 MiB more than the default 8 MiB
        "alloc", "200Mi",
        "setlimit", "2", "8Mi",
        "alloc", "200Mi",
        "setlimit", "1", "2Gi",  # printf FIFO past the slice
        "setlimit", "0", "4096",  # 3072 bytes more per thread x 32768 threads = 96 MiB
        "info",
        "setlimit", "0", "65536",  # 2 GiB of stack
    )  # fmt: skip
    assert [s[1] for s in steps(out.stdout) if s[0] == "setlimit"] == ["0", "0", OOM, "0", OOM]
    assert [s[1] for s in steps(out.stdout) if s[0] == "alloc"] == [OOM, "0"], out.stdout
    assert step(out.stdout, "info")[2] == str(GiB - 200 * MiB - 96 * MiB)


def test_destroying_a_context_gives_its_limits_back(node: Sandbox) -> None:
    out = node.run(
        "mem_ops", "ctx", "0", "ctxcreate", "0", "setlimit", "2", "520Mi", "ctxdestroy", "0",
        "ctx", "0", "alloc", "1000Mi",
    )  # fmt: skip
    assert step(out.stdout, "setlimit")[1] == "0", out.stdout
    assert step(out.stdout, "alloc")[1] == "0", out.stdout


@pytest.mark.parametrize("own_pool", [False, True])
def test_memory_a_pool_keeps_after_a_free_stays_counted(node: Sandbox, own_pool: bool) -> None:
    run_script(node, SCRIPTS["pool-keeps-own" if own_pool else "pool-keeps-default"])


def test_pool_memory_is_given_back_when_the_pool_releases_it(node: Sandbox) -> None:
    run_script(node, SCRIPTS["pool-gives-back"])


@pytest.mark.parametrize("lookup", ["direct", "procaddr"])
def test_graph_memory_nodes_count_when_backed_until_trimmed(node: Sandbox, lookup: str) -> None:
    run_script(node, SCRIPTS["graph-backed-until-trimmed"], lookup=lookup)


def test_a_pool_counts_on_its_own_device_not_the_callers(node: Sandbox) -> None:
    # A pool made on device 1 and used from device 0's context: its memory is device 1's.
    node.device_count = 2
    node.write_fake_config()
    node.write_limits(devices=2)
    out = node.run(
        "mem_ops", "ctx", "0", "mkpool", "1", "pool", "1Gi", "pool", "1",
        "alloc", "1Gi",  # device 0's slice is untouched
    )  # fmt: skip
    assert [x[1] for x in steps(out.stdout) if x[0] == "pool"] == ["0", OOM], out.stdout
    assert step(out.stdout, "alloc")[1] == "0", out.stdout


@pytest.mark.parametrize("instantiate", ["instantiatep", "instantiate2"])
def test_graph_memory_counts_whichever_way_the_exec_is_made(
    node: Sandbox, instantiate: str
) -> None:
    run_script(node, SCRIPTS[f"graph-{instantiate}"])


def test_a_captured_async_allocation_counts_with_its_graph_not_twice(node: Sandbox) -> None:
    run_script(node, SCRIPTS["graph-captured-async"])


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_shared_scripts_hold_on_a_larger_slice(node: Sandbox, name: str) -> None:
    # The real-driver suite runs these scripts on a 2 GiB slice of a much larger GPU.
    node.device_memory = 8 * GiB
    node.write_fake_config()
    node.write_limits(memory=2 * GiB)
    out = node.run("mem_ops", *SCRIPTS[name].args(2))
    assert out.returncode == 0, out.stdout + out.stderr
    SCRIPTS[name].check(out.stdout, 2, 0)


@pytest.mark.parametrize("lookup", ["direct", "procaddr"])
def test_memory_a_graph_still_holds_is_not_free_for_the_next_exec(
    node: Sandbox, lookup: str
) -> None:
    run_script(node, SCRIPTS["graph-unfreed-not-reused"], lookup=lookup)


def test_a_graph_allocation_freed_by_address_goes_back_through_the_pool(node: Sandbox) -> None:
    run_script(node, SCRIPTS["graph-freed-by-address"])


@pytest.mark.parametrize("lookup", LOOKUPS)
@pytest.mark.parametrize("kind", ["alloc", "async"])
def test_a_captured_free_that_never_runs_keeps_the_memory_counted(
    node: Sandbox, kind: str, lookup: str
) -> None:
    run_script(node, SCRIPTS[f"captured-free-{kind}"], lookup=lookup)


@pytest.mark.parametrize("lookup", ["direct", "procaddr"])
def test_allocations_inside_a_moved_child_graph_count(node: Sandbox, lookup: str) -> None:
    run_script(node, SCRIPTS["graph-child-allocation"], lookup=lookup)


def test_child_graphs_nested_past_the_bound_are_refused(node: Sandbox) -> None:
    # Counting walks every level; a nesting past 16 levels is refused rather than walked.
    out = node.run(
        "mem_ops", "ctx", "0",
        "graphnest", "0", "700Mi", "16",  # id 0: counted through 16 levels
        "graphnest", "0", "100Mi", "17",  # id 1: one level too many
        "alloc", "400Mi",  # id 2
        "instantiate", "0", "0",  # id 3
        "glaunch", "3",  # the innermost 700 MiB would pass the slice
        "instantiate", "1", "0",
    )  # fmt: skip
    assert [s[1] for s in steps(out.stdout) if s[0] == "graphnest"] == ["0", "0"], out.stdout
    assert [s[1] for s in steps(out.stdout) if s[0] == "glaunch"] == [OOM], out.stdout
    assert [s[1] for s in steps(out.stdout) if s[0] == "instantiate"] == ["0", OOM], out.stdout


# A kernel needing 16 KiB of local memory per thread: a launch raises the context's stack
# to it for all 16 x 2048 resident threads of the double's GPU, 480 MiB past the default.
DEEP = "deep_local16384_10us"
STACK_GROWTH = 16384 * 16 * 2048 - 1024 * 16 * 2048


@pytest.mark.parametrize("lookup", LOOKUPS)
def test_a_launch_that_raises_the_stack_counts_it(node: Sandbox, lookup: str) -> None:
    out = node.run(
        "mem_ops", "ctx", "0",
        "alloc", "400Mi",
        "kernel", DEEP,  # 480 MiB of stack: fits beside 400 MiB
        "info",
        "alloc", "200Mi",  # 400 + 480 + 200 MiB: past the slice
        "kernel", DEEP,  # already raised: nothing more
        "info",
        lookup=lookup,
    )  # fmt: skip
    assert results(out.stdout, "kernel") == ["0", "0"], out.stdout + out.stderr
    assert results(out.stdout, "alloc") == ["0", OOM], out.stdout
    assert step(out.stdout, "info", 0)[2] == str(GiB - 400 * MiB - STACK_GROWTH)
    assert step(out.stdout, "info", 1)[2] == str(GiB - 400 * MiB - STACK_GROWTH)


def test_a_graph_whose_kernel_stack_would_pass_the_slice_is_refused(node: Sandbox) -> None:
    # The same attack through a graph: its kernel nodes raise the stack when the graph
    # runs, and a graph launch is no kernel launch the shim checks. The instantiation
    # raises the stack first, counted, so a graph that would pass the slice is refused.
    out = node.run(
        "mem_ops", "ctx", "0",
        "alloc", "600Mi",  # id 0
        "gkernel", DEEP,  # id 1
        "instantiate", "1", "0",  # 600 + 480 MiB: past the slice
        "free", "0",
        "instantiate", "1", "0",  # id 2: now it fits
        "glaunch", "2",
        "sync",
        "info",
        "alloc", "600Mi",  # 480 + 600 MiB: the stack stays counted
    )  # fmt: skip
    assert results(out.stdout, "gkernel") == ["0"], out.stdout + out.stderr
    assert results(out.stdout, "instantiate") == [OOM, "0"], out.stdout + out.stderr
    assert results(out.stdout, "glaunch") == ["0"], out.stdout
    assert step(out.stdout, "info")[2] == str(GiB - STACK_GROWTH)
    assert results(out.stdout, "alloc") == ["0", OOM], out.stdout


@pytest.mark.parametrize("core", [100, 50])  # unpaced and paced launch paths
def test_a_multi_device_launch_whose_stack_would_pass_the_slice_is_refused(
    node: Sandbox, core: int
) -> None:
    node.write_limits(core=core)
    out = node.run(
        "mem_ops", "ctx", "0",
        "alloc", "600Mi",  # id 0
        "multikernel", DEEP,  # 600 + 480 MiB: past the slice
        "free", "0",
        "multikernel", DEEP,  # now it fits, and stays counted
        "info",
    )  # fmt: skip
    assert results(out.stdout, "multikernel") == [OOM, "0"], out.stdout + out.stderr
    assert step(out.stdout, "info")[2] == str(GiB - STACK_GROWTH)


def test_a_launch_whose_stack_would_pass_the_slice_is_refused(node: Sandbox) -> None:
    # The attack: a kernel with large local arrays makes the driver allocate its stack for
    # every resident thread at launch, outside any allocation call. Lowering the stack
    # afterwards and launching again must not take it uncounted either.
    out = node.run(
        "mem_ops", "ctx", "0",
        "alloc", "600Mi",  # id 0
        "kernel", DEEP,  # 600 + 480 MiB: past the slice
        "free", "0",
        "kernel", DEEP,  # now it fits
        "setlimit", "0", "1024",  # back to the default: given back
        "alloc", "600Mi",
        "kernel", DEEP,  # raised again, past the slice again
        "info",
    )  # fmt: skip
    assert results(out.stdout, "kernel") == [OOM, "0", OOM], out.stdout + out.stderr
    assert results(out.stdout, "setlimit", "alloc") == ["0", "0", "0"], out.stdout
    assert step(out.stdout, "info")[2] == str(GiB - 600 * MiB)
