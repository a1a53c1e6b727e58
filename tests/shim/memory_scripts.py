"""`mem_ops` scripts for the allocation paths beyond cuMemAlloc, with what each must print.

They run on the fake driver (tests/shim/test_memory.py) and on the real one
(tests/gpu/test_memory_gpu.py), so the double is held to what the driver does. A script is
written for a slice of ``unit`` GiB; sizes scale with it. ``slack`` is how many bytes past
a request the driver may reserve (a pool or graph pool rounds up on a real GPU; the double
reserves exactly): free memory after the script must lie in [exact - slack, exact].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tests.shim.sandbox import GiB, MiB, step, steps

OOM = "2"  # CUDA_ERROR_OUT_OF_MEMORY
INVALID_VALUE = "1"
NOT_SUPPORTED = "801"


def results(stdout: str, *names: str) -> list[str]:
    """The CUresult of every step called one of ``names``, in order."""
    return [s[1] for s in steps(stdout) if s[0] in names]


def free_is(stdout: str, exact: int, slack: int) -> None:
    free = int(step(stdout, "info")[2])
    assert exact - slack <= free <= exact, (free, exact, stdout)


@dataclass(frozen=True)
class Script:
    """Steps for a slice of ``unit`` GiB, and the check of their output."""

    steps: Callable[[int], tuple[str, ...]]
    check: Callable[[str, int, int], None]  # stdout, unit, slack

    def args(self, unit: int) -> tuple[str, ...]:
        return ("ctx", "0", *self.steps(unit))


def mi(n: int, unit: int) -> str:
    return f"{n * unit}Mi"


def linear(kind: str) -> Script:
    """managed / async / pool: the second of two 700 MiB allocations passes the slice.
    The driver refuses a stream-ordered free of managed memory (seen on an H200): it stays
    allocated, and counted, until cuMemFree."""
    managed = kind == "managed"

    def script(u: int) -> tuple[str, ...]:
        free = ("freeasync", "0", "free", "0") if managed else ("freeasync", "0")
        return (kind, mi(700, u), kind, mi(700, u), *free, kind, mi(700, u), "info")

    def check(out: str, u: int, slack: int) -> None:
        assert results(out, kind) == ["0", OOM, "0"], out
        assert results(out, "freeasync", "free") == ([NOT_SUPPORTED, "0"] if managed else ["0"])
        free_is(out, u * (GiB - 700 * MiB), slack)

    return Script(script, check)


def _vmm(u: int) -> tuple[str, ...]:
    return (
        "create", "0", mi(768, u),
        "create", "0", mi(512, u),  # past the slice
        "release", "0",
        "create", "0", mi(512, u),
        "info",
    )  # fmt: skip


def _vmm_check(out: str, u: int, slack: int) -> None:
    assert results(out, "create") == ["0", OOM, "0"], out
    free_is(out, u * (GiB - 512 * MiB), slack)


VMM_CREATE_RELEASE = Script(_vmm, _vmm_check)


def _mapped(u: int) -> tuple[str, ...]:
    # Releasing a handle right after mapping it is how the VMM API is used; the driver
    # keeps the memory until it is unmapped, and so must the slice.
    return (
        "create", "0", mi(600, u),  # id 0
        "vreserve", mi(1024, u),  # id 1
        "map", "1", "0", mi(600, u),
        "release", "0",
        "alloc", mi(600, u),  # still mapped: does not fit
        "unmap", "1", mi(600, u),
        "alloc", mi(600, u),  # now it does
        "release", "0",  # a second release is the driver's error, not a second free
        "info",
    )  # fmt: skip


def _mapped_check(out: str, u: int, slack: int) -> None:
    assert results(out, "map", "unmap") == ["0", "0"], out
    assert results(out, "alloc") == [OOM, "0"], out
    assert results(out, "release") == ["0", INVALID_VALUE], out
    free_is(out, u * (GiB - 600 * MiB), slack)


VMM_RELEASED_WHILE_MAPPED = Script(_mapped, _mapped_check)


def pool_keeps_after_free(own_pool: bool) -> Script:
    """With a raised release threshold the pool keeps freed memory on the GPU: it stays in
    the slice until the pool gives it back (trim), however the pool came to be."""

    def script(u: int) -> tuple[str, ...]:
        return (
            *(["mkpool", "0"] if own_pool else []),
            "threshold", mi(4096, u),
            "pool", mi(700, u),  # id 0
            "freeasync", "0",
            "sync",
            "alloc", mi(700, u),  # the pool still holds 700 MiB: past the slice
            "pool", mi(700, u),  # the pool's own free memory is reused: fits
            "freeasync", "1",
            "trim", "0",  # the free is the stream's, not reached yet: nothing to release
            "alloc", mi(700, u),  # still past the slice
            "sync",
            "trim", "0",
            "alloc", mi(700, u),  # given back: fits
            "info",
        )  # fmt: skip

    def check(out: str, u: int, slack: int) -> None:
        assert results(out, "pool") == ["0", "0"], out
        assert results(out, "alloc") == [OOM, OOM, "0"], out
        free_is(out, u * (GiB - 700 * MiB), slack)

    return Script(script, check)


def _pool_release(u: int) -> tuple[str, ...]:
    # Default threshold: the pool releases at the next synchronisation, not at the free.
    return (
        "async", mi(700, u), "freeasync", "0",
        "alloc", mi(700, u),  # not yet released: past the slice
        "sync",
        "alloc", mi(700, u),
        "mkpool", "0", "threshold", mi(4096, u), "pool", mi(200, u), "freeasync", "2",
        "alloc", mi(200, u),  # the created pool holds 200 MiB
        "rmpool",
        "alloc", mi(200, u),  # destroying it gave them back
    )  # fmt: skip


def _pool_release_check(out: str, u: int, slack: int) -> None:
    assert results(out, "alloc") == [OOM, "0", OOM, "0"], out


POOL_GIVES_BACK = Script(_pool_release, _pool_release_check)


def _graph_trim(u: int) -> tuple[str, ...]:
    return (
        "graphfree", "0", mi(700, u),  # id 0: allocates and frees 700 MiB
        "instantiate", "0", "2",  # the upload flag is cuGraphInstantiateWithParams' alone
        "instantiate", "0", "0",  # id 1: no memory yet
        "alloc", mi(400, u),  # id 2
        "glaunch", "1",  # backing 700 MiB would pass the slice
        "free", "2",
        "glaunch", "1",
        "glaunch", "1",  # backed once
        "alloc", mi(400, u),
        "sync",
        "gexecdestroy", "1",
        "alloc", mi(400, u),  # the graph pool keeps the memory
        "gtrim", "0",
        "alloc", mi(400, u),  # trimmed: given back
        "instantiatep", "0", "2",  # upload at instantiation: backed now, past the slice
        "info",
    )  # fmt: skip


def _graph_trim_check(out: str, u: int, slack: int) -> None:
    assert results(out, "glaunch") == [OOM, "0", "0"], out
    assert results(out, "alloc") == ["0", OOM, OOM, "0"], out
    assert results(out, "instantiate") == [INVALID_VALUE, "0", OOM], out
    free_is(out, u * (GiB - 400 * MiB), slack)


GRAPH_BACKED_UNTIL_TRIMMED = Script(_graph_trim, _graph_trim_check)


def _graph_unfreed(u: int) -> tuple[str, ...]:
    # An allocation no node of its graph frees outlives the exec: the driver's graph pool
    # keeps it through a trim (seen on an H200), and the slice counts it.
    return (
        "graph", "0", mi(700, u),  # id 0: allocates, never frees
        "instantiate", "0", "0",  # id 1
        "glaunch", "1",
        "glaunch", "1",  # the last launch's allocation is live: the driver refuses
        "sync",
        "gexecdestroy", "1",
        "gtrim", "0",
        "alloc", mi(400, u),  # 700 MiB still allocated: past the slice
        "info",
    )  # fmt: skip


def _graph_unfreed_check(out: str, u: int, slack: int) -> None:
    assert results(out, "glaunch", "gexecdestroy", "gtrim") == ["0", INVALID_VALUE, "0", "0"], out
    assert results(out, "alloc") == [OOM], out
    free_is(out, u * (GiB - 700 * MiB), slack)


GRAPH_UNFREED_OUTLIVES_ITS_EXEC = Script(_graph_unfreed, _graph_unfreed_check)


def _graph_unfreed_twice(u: int) -> tuple[str, ...]:
    # The attack: memory a destroyed exec's graph still holds is not free for the next
    # exec. Counting only the execs alive, the second graph would be backed from memory
    # the first still has allocated, and the driver would take 700 MiB more.
    return (
        "graph", "0", mi(700, u),  # id 0: allocates, never frees
        "instantiate", "0", "0",  # id 1
        "glaunch", "1",
        "sync",
        "gexecdestroy", "1",
        "graph", "0", mi(700, u),  # id 2: the same again
        "instantiate", "2", "0",  # id 3
        "glaunch", "3",  # 700 MiB more would pass the slice
        "info",
    )  # fmt: skip


def _graph_unfreed_twice_check(out: str, u: int, slack: int) -> None:
    assert results(out, "glaunch") == ["0", OOM], out
    free_is(out, u * (GiB - 700 * MiB), slack)


GRAPH_UNFREED_NOT_REUSED = Script(_graph_unfreed_twice, _graph_unfreed_twice_check)


def _graph_freed_by_address(u: int) -> tuple[str, ...]:
    # A program frees a graph's allocation with cuMemFree: the memory goes back to the
    # graph pool (still reserved, still counted), the exec may run again, and a trim
    # gives it back once nothing holds it.
    return (
        "graphptr", "0", mi(700, u),  # id 0: the graph, id 1: its allocation's address
        "instantiate", "0", "0",  # id 2
        "glaunch", "2",
        "glaunch", "2",  # still allocated: refused
        "alloc", mi(400, u),  # 700 + 400 MiB: past the slice
        "free", "1",
        "alloc", mi(400, u),  # freed into the graph pool, which keeps it
        "glaunch", "2",  # runs again from the pool
        "free", "1",
        "sync",
        "gexecdestroy", "2",
        "gtrim", "0",
        "alloc", mi(400, u),  # trimmed: given back
        "info",
    )  # fmt: skip


def _graph_freed_by_address_check(out: str, u: int, slack: int) -> None:
    assert results(out, "glaunch") == ["0", INVALID_VALUE, "0"], out
    assert results(out, "free") == ["0", "0"], out
    assert results(out, "alloc") == [OOM, OOM, "0"], out
    free_is(out, u * (GiB - 400 * MiB), slack)


GRAPH_FREED_BY_ADDRESS = Script(_graph_freed_by_address, _graph_freed_by_address_check)


def graph_instantiated_by(instantiate: str) -> Script:
    """cuGraphInstantiateWithParams and the pre-12.0 cuGraphInstantiate_v2 make execs too;
    the shim reads the graph's allocation nodes from the driver at instantiation."""
    flags = ["0"] if instantiate == "instantiatep" else []
    upload = ["instantiatep", "0", "2"] if instantiate == "instantiatep" else []

    def script(u: int) -> tuple[str, ...]:
        return (
            "graph", "0", mi(700, u),  # id 0
            "alloc", mi(400, u),  # id 1
            instantiate, "0", *flags,  # id 2
            "glaunch", "2",  # backing 700 MiB would pass the slice
            *upload,
            "free", "1",
            "glaunch", "2",
            "alloc", mi(400, u),
        )  # fmt: skip

    def check(out: str, u: int, slack: int) -> None:
        assert results(out, "glaunch") == [OOM, "0"], out
        assert results(out, "instantiate") == (["0", OOM] if upload else ["0"]), out
        assert results(out, "alloc") == ["0", OOM], out

    return Script(script, check)


def _captured(u: int) -> tuple[str, ...]:
    # Under stream capture cuMemAllocAsync only adds an allocation node: no memory now.
    # The graph's memory counts when its exec is backed, once.
    return (
        "stream",  # id 0
        "capture", "0",
        "asyncon", "0", mi(700, u),  # id 1: a node, no memory
        "endcapture", "0",  # id 2: the graph
        "alloc", mi(400, u),  # id 3: fits, nothing else is held
        "instantiate", "2", "0",  # id 4
        "glaunch", "4",  # 700 MiB more would pass the slice
        "free", "3",
        "glaunch", "4",
        "info",
    )  # fmt: skip


def _captured_check(out: str, u: int, slack: int) -> None:
    assert results(out, "capture", "asyncon", "endcapture") == ["0", "0", "0"], out
    assert results(out, "alloc") == ["0"], out
    assert results(out, "glaunch") == [OOM, "0"], out
    free_is(out, u * (GiB - 700 * MiB), slack)


CAPTURED_ASYNC_COUNTS_ONCE = Script(_captured, _captured_check)


def _graph_child(u: int) -> tuple[str, ...]:
    # The attack: a child graph moved into its parent (12.9) may hold allocation nodes;
    # counting the parent's own nodes only, its exec would be backed with nothing.
    return (
        "graphchild", "0", mi(700, u),  # id 0
        "alloc", mi(400, u),  # id 1
        "instantiate", "0", "0",  # id 2
        "glaunch", "2",  # the child's 700 MiB would pass the slice
        "free", "1",
        "glaunch", "2",
        "info",
    )  # fmt: skip


def _graph_child_check(out: str, u: int, slack: int) -> None:
    assert results(out, "graphchild", "instantiate") == ["0", "0"], out
    assert results(out, "glaunch") == [OOM, "0"], out
    free_is(out, u * (GiB - 700 * MiB), slack)


GRAPH_CHILD_ALLOCATION_COUNTS = Script(_graph_child, _graph_child_check)


def captured_free(kind: str) -> Script:
    """The attack: a cuMemFreeAsync on a capturing stream is only a node of the graph
    being captured, and the capture is never launched. Releasing the count at the call
    would free the slice while the memory stays allocated, again and again."""

    def script(u: int) -> tuple[str, ...]:
        return (
            "stream",  # id 0
            kind, mi(700, u),  # id 1
            "capture", "0",
            "freeon", "0", "1",
            "endcapture", "0",  # id 2: never instantiated
            kind, mi(700, u),  # still allocated: past the slice
            "info",
        )  # fmt: skip

    def check(out: str, u: int, slack: int) -> None:
        # whether the driver takes a captured free of this memory is the driver's business;
        # either way it is not freed, and stays counted
        assert results(out, kind) == ["0", OOM], out
        free_is(out, u * (GiB - 700 * MiB), slack)

    return Script(script, check)


# Every script, by name: the real-driver suite runs them all.
SCRIPTS: dict[str, Script] = {
    "managed": linear("managed"),
    "async": linear("async"),
    "pool": linear("pool"),
    "vmm-create-release": VMM_CREATE_RELEASE,
    "vmm-released-while-mapped": VMM_RELEASED_WHILE_MAPPED,
    "pool-keeps-default": pool_keeps_after_free(own_pool=False),
    "pool-keeps-own": pool_keeps_after_free(own_pool=True),
    "pool-gives-back": POOL_GIVES_BACK,
    "graph-backed-until-trimmed": GRAPH_BACKED_UNTIL_TRIMMED,
    "graph-unfreed-outlives-its-exec": GRAPH_UNFREED_OUTLIVES_ITS_EXEC,
    "graph-unfreed-not-reused": GRAPH_UNFREED_NOT_REUSED,
    "graph-freed-by-address": GRAPH_FREED_BY_ADDRESS,
    "graph-child-allocation": GRAPH_CHILD_ALLOCATION_COUNTS,
    "captured-free-alloc": captured_free("alloc"),
    "captured-free-async": captured_free("async"),
    "graph-instantiatep": graph_instantiated_by("instantiatep"),
    "graph-instantiate2": graph_instantiated_by("instantiate2"),
    "graph-captured-async": CAPTURED_ASYNC_COUNTS_ONCE,
}
