"""One container, many processes: a shared slice, SIGKILL, fork, exit."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.shim.sandbox import (
    BUILD,
    GiB,
    MiB,
    Sandbox,
    can_make_mount_namespaces,
    step,
    steps,
    wait_for,
)

OOM = "2"


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate("go\n", timeout=30)
    return out


def test_processes_share_one_slice(node: Sandbox) -> None:
    holder = node.start("mem_ops", "ctx", "0", "alloc", "600Mi", "wait")
    try:
        wait_for(holder, "waiting")
        out = node.run("mem_ops", "ctx", "0", "alloc", "600Mi", "alloc", "400Mi", "info")
        assert [x[1] for x in steps(out.stdout) if x[0] == "alloc"] == [OOM, "0"]
        assert step(out.stdout, "info")[2] == str(24 * MiB)
        region = node.region()
        assert region.devices[0].memory_used == 600 * MiB  # the second process has exited
        assert [p.used[0] for p in region.processes] == [600 * MiB]
    finally:
        finish(holder)
    assert node.region().devices[0].memory_used == 0  # a normal exit gives usage back


def test_nvml_shows_the_whole_containers_usage(node: Sandbox) -> None:
    holder = node.start("mem_ops", "ctx", "0", "alloc", "600Mi", "wait")
    try:
        wait_for(holder, "waiting")
        out = node.run("nvml_ops")
        mem = step(out.stdout, "mem")
        assert mem[3:] == ["0", str(GiB), str(600 * MiB), str(424 * MiB)]
        assert step(out.stdout, "mem2")[3:] == mem[3:]
    finally:
        finish(holder)


def test_nvml_without_the_shim_shows_the_device(node: Sandbox) -> None:
    out = node.run("nvml_ops", preload=None)
    assert step(out.stdout, "mem")[4] == str(4 * GiB)


def test_sigkilled_process_usage_is_reclaimed(node: Sandbox) -> None:
    victim = node.start("mem_ops", "ctx", "0", "alloc", "700Mi", "wait")
    wait_for(victim, "waiting")
    assert node.region().devices[0].memory_used == 700 * MiB
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=10)
    out = node.run("mem_ops", "ctx", "0", "alloc", "700Mi", "info")
    assert step(out.stdout, "alloc")[1] == "0"
    assert node.region().reclaimed_procs == 1


def test_process_killing_itself_mid_run_is_reclaimed(node: Sandbox) -> None:
    out = node.run("mem_ops", "ctx", "0", "alloc", "900Mi", "kill")
    assert out.returncode == -signal.SIGKILL
    again = node.run("mem_ops", "ctx", "0", "info", "alloc", "900Mi")
    assert step(again.stdout, "info")[2] == str(GiB)
    assert step(again.stdout, "alloc")[1] == "0"


def test_forked_child_shares_the_slice_but_not_the_parents_memory(node: Sandbox) -> None:
    out = node.run(
        "mem_ops",
        "ctx",
        "0",
        "alloc",
        "600Mi",
        "fork",
        "600Mi",
        "fork",
        "300Mi",
        "info",
        "free",
        "0",
        "info",
    )
    children = [x[1] for x in steps(out.stdout) if x[0] == "child"]
    assert children == [OOM, "0"]
    # the children exited without freeing: their usage is reclaimed as dead
    infos = [int(x[2]) for x in steps(out.stdout) if x[0] == "info"]
    assert infos == [GiB - 600 * MiB, GiB]


def test_concurrent_processes_never_pass_the_slice(node: Sandbox) -> None:
    procs = [node.start("mem_ops", "ctx", "0", "tfill", "4", "10Mi", "wait") for _ in range(4)]
    try:
        got = 0
        for p in procs:
            lines = wait_for(p, "waiting")
            got += int(next(x for x in lines if x.startswith("tfill")).split()[1])
        assert got == (GiB // (10 * MiB)) * 10 * MiB
        assert node.region().devices[0].memory_used == got
    finally:
        for p in procs:
            finish(p)


def test_exec_drops_the_old_images_usage(node: Sandbox) -> None:
    out = node.run("mem_ops", "ctx", "0", "alloc", "600Mi", "exec", "ctx", "0", "info")
    assert step(out.stdout, "alloc")[1] == "0"
    assert step(out.stdout, "info")[2] == str(GiB)
    assert [p.used[0] for p in node.region().processes] == []


def test_first_calls_from_a_constructor_and_racing_threads(node: Sandbox) -> None:
    out = node.run("first_call", "8")
    assert out.returncode == 0, out.stderr
    assert step(out.stdout, "ctor")[1] == "0"
    # 600 MiB from the constructor leave room for exactly 4 of the 8 racing 100 MiB
    assert step(out.stdout, "threads")[1:] == ["4", "4", "0"]
    assert step(out.stdout, "info")[2] == str(GiB - 1000 * MiB)


def test_a_full_region_volume_is_a_clear_error_not_a_crash(node: Sandbox, tmp_path: Path) -> None:
    """The region volume is a small tmpfs (its sizeLimit on Kubernetes 1.22+) that the
    container may fill itself. A region initialised there must not take its blocks at the
    first write through the mapping (SIGBUS, the process killed): the shim says why."""
    if not can_make_mount_namespaces():
        pytest.skip("needs a private mount namespace (unshare --mount as root)")
    volume = tmp_path / "volume"
    volume.mkdir()
    script = (
        f"mount -t tmpfs -o size=256k tmpfs {volume} && "
        f"dd if=/dev/zero of={volume}/filler bs=1k count=200 2>/dev/null && "
        f"exec {BUILD / 'tests' / 'mem_ops'} ctx 0 alloc 1Mi info"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env=node.env(region=volume / "region"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode >= 0, f"killed by signal {-done.returncode}: {done.stderr}"
    assert "cannot size region" in done.stderr, done.stderr
    assert "No space left on device" in done.stderr, done.stderr
