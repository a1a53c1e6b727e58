"""What a container does to the files it can write, against the agent as the chart runs it:
uid 0 with every capability dropped, so permissions hold for the agent too (no reading or
writing past a mode). The agent's code runs in a child process under setpriv with an
empty bounding set; the container's moves are made on the same host files."""

import json
import os
import resource
import shutil
import stat
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from agent.containers import LiveContainer
from agent.hostfiles import AllocationFiles, allocation_key, remove_container_tree
from agent.metrics import AgentCollector, build_registry
from fracgpu import shim_abi as abi
from fracgpu.names import RESOURCE_VCUDA_CORE
from fracgpu.shim_abi import DeviceLimits, Limits, encode_limits
from tests.agent.regionvolume import region_in_volume
from tests.promtext import samples
from tests.shimregion import blank_region

REPO = Path(__file__).resolve().parents[2]
SETPRIV = shutil.which("setpriv")
POD_UID = "00000000-0000-0000-0000-00000000000{}"

needs_capless_root = pytest.mark.skipif(
    SETPRIV is None or os.geteuid() != 0,
    reason="dropping every capability of uid 0 needs root and setpriv (util-linux)",
)


def run_as_the_agent(code: str, *keep: str) -> dict[str, object]:
    """Run ``code`` as uid 0 with no capability but ``keep`` (e.g. "fowner"); it prints
    one JSON object."""
    assert SETPRIV is not None
    bounding = ",".join(["-all", *(f"+{cap}" for cap in keep)])
    capless = [SETPRIV, "--inh-caps=-all", f"--bounding-set={bounding}", "--no-new-privs"]
    result = subprocess.run(
        [*capless, sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    found: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def _container(files: AllocationFiles, pod: str, n: int) -> str:
    key = allocation_key(RESOURCE_VCUDA_CORE, [f"GPU-a-core-{n}"])
    files.prepare(key)
    limits = Limits(
        devices=(DeviceLimits("GPU-a", 1 << 30, 50),),
        namespace="team",
        pod=pod,
        container="main",
        pod_uid=POD_UID.format(n),
    )
    files.write_limits(key, encode_limits(limits).decode())
    assert files.pods_dir is not None
    region = region_in_volume(files.pods_dir, POD_UID.format(n), "main")
    region.write_bytes(_region_bytes(("GPU-a", 1 << 30, 0)))
    return key


@needs_capless_root
def test_a_container_that_locks_its_region_directory_blinds_only_itself(tmp_path: Path) -> None:
    """The attack: root in the container runs ``chmod 000`` on its region directory (its
    region volume, which it may write). The agent cannot look inside; before, the error
    escaped and every container's metrics and the slice audit of the whole node failed
    with it."""
    files = AllocationFiles(tmp_path / "state", tmp_path / "pods")
    _container(files, "victim", 1)
    _container(files, "attacker", 2)
    os.chmod(region_in_volume(tmp_path / "pods", POD_UID.format(2), "main").parent, 0)
    found = run_as_the_agent(
        f"""
        import json
        from pathlib import Path
        from agent.containers import live_containers
        from agent.hostfiles import AllocationFiles
        from agent.podresources import ContainerDevices
        from agent.slice_audit import SliceAudit

        holders = [
            ContainerDevices("team", pod, "main", {{"{RESOURCE_VCUDA_CORE}": frozenset([i])}})
            for pod, i in (("victim", "GPU-a-core-1"), ("attacker", "GPU-a-core-2"))
        ]
        class Kubelet:
            def list(self):
                return holders
        class Nvml:
            def compute_processes(self, uuid):
                return []
        files = AllocationFiles(Path({str(tmp_path / "state")!r}), Path({str(tmp_path / "pods")!r}))
        def live():
            return live_containers(Kubelet(), ["{RESOURCE_VCUDA_CORE}"], files)
        SliceAudit(Nvml(), live).run_once()
        print(json.dumps({{c.pod: [c.limits is not None, c.region is not None] for c in live()}}))
        """
    )
    # The victim is seen whole; the attacker keeps its limits (the audit reads them), only
    # its own region (usage it reports about itself) is missing.
    assert found == {"victim": [True, True], "attacker": [True, False]}


@needs_capless_root
def test_boards_are_published_again_and_again_without_capabilities(tmp_path: Path) -> None:
    """A board is written in place at every publish; created read-only (0444), the second
    publish failed for an agent without the capability to write past a mode, and every
    board on the node stayed as the first publish left it."""
    node = tmp_path / "node"
    found = run_as_the_agent(
        f"""
        import json
        from pathlib import Path
        from agent.boardfiles import BoardFiles
        from agent.boards import BoardPublisher
        from fracgpu.shim_abi import decode_board

        node = Path({str(node)!r})
        boards = BoardFiles(node)
        boards.prepare()
        publisher = BoardPublisher(boards, lambda: ["GPU-a"], lambda: [])
        on_disk = []
        for _ in range(3):
            publisher.publish()
            on_disk.append(decode_board((node / "GPU-a").read_bytes()).sequence)
        print(json.dumps({{"on_disk": on_disk}}))
        """
    )
    assert found == {"on_disk": [1, 2, 3]}
    assert (node / "GPU-a").stat().st_mode & 0o777 == 0o644  # the node dir is mounted read-only


def _leave_files(run: Path) -> None:
    """What a container may leave in its region directory: root in it locks a directory
    (chmod 000), another user makes one only it may write."""
    locked = run / "locked"
    locked.mkdir()
    (locked / "data").write_bytes(b"x" * 4096)
    locked.chmod(0)
    theirs = run / "theirs"
    theirs.mkdir()
    (theirs / "data").write_bytes(b"x" * 4096)
    os.chown(theirs / "data", 1000, 1000)
    os.chown(theirs, 1000, 1000)
    theirs.chmod(0o755)


def _remove_as_the_agent(run: Path, *keep: str) -> dict[str, object]:
    return run_as_the_agent(
        f"""
        import json, os
        from pathlib import Path
        from agent.hostfiles import remove_container_tree

        gone = remove_container_tree(Path({str(run)!r}))
        print(json.dumps({{"gone": gone, "left": os.path.lexists({str(run)!r})}}))
        """,
        *keep,
    )


@needs_capless_root
def test_files_a_container_locked_are_removed_with_its_directory(tmp_path: Path) -> None:
    """Before, the removal ignored its errors: a locked directory and its data outlived
    the pod on the host disk, silently. The agent gives its owner's permissions back first
    (root in the container is the agent's uid), and with FOWNER, as the chart runs it,
    whoever made them."""
    for keep, fully in (((), False), (("fowner",), True)):
        run = tmp_path / f"run-{len(keep)}"
        run.mkdir()
        run.chmod(0o777)
        _leave_files(run)
        found = _remove_as_the_agent(run, *keep)
        assert found == {"gone": fully, "left": not fully}
        if not fully:  # only another user's directory is left, and the removal said so
            assert sorted(p.name for p in run.iterdir()) == ["theirs"]


def _region(*devices: tuple[str, int, int]) -> tuple[abi.RegionDevice, ...]:
    return abi.decode_region(_region_bytes(*devices)).devices


def _region_bytes(*devices: tuple[str, int, int]) -> bytes:
    """A region as a container could write it: (uuid, memory limit, memory used) per GPU."""
    data = blank_region(len(devices))
    for i, (uuid, limit, used) in enumerate(devices):
        base = abi.DEVICES_OFF + i * abi.DEV_SIZE
        data[base : base + len(uuid)] = uuid.encode()
        struct.pack_into("<QQ", data, base + abi.DEV_OFF_MEMORY_LIMIT, limit, used)
    return bytes(data)


def test_a_region_cannot_add_gpus_or_raise_limits_in_the_metrics() -> None:
    """The region is the container's to write: it may misreport its own use (documented),
    but the GPUs it holds and their limits come from the agent's limits file only."""
    limits = Limits(devices=(DeviceLimits("GPU-mine", 1 << 30, 50),))
    region = _region(("GPU-mine", 2**64 - 1, 1 << 20), ("GPU-neighbours", 2**64 - 1, 140 << 30))
    spoofer = LiveContainer("team", "spoofer", "main", ("k",), limits, region)
    collector = AgentCollector(None, list, dict, lambda: [spoofer], gpu_manager_metrics=True)
    found = samples(generate_latest(build_registry(collector)).decode())
    container_series = [s for s in found if s.startswith(("fracgpu_container_", "container_"))]
    assert container_series, "the spoofer's own GPU is still exported"
    assert not [s for s in container_series if "GPU-neighbours" in s]
    limits_exported = {
        s: v for s, v in found.items() if s.startswith("fracgpu_container_memory_limit_bytes")
    }
    assert list(limits_exported.values()) == [float(1 << 30)]
    used = [v for s, v in found.items() if s.startswith("fracgpu_container_memory_used_bytes")]
    assert used == [float(1 << 20)]  # its own use, as it reports it


class _Listed:
    """What os.scandir returned, already read: a context manager that iterates it."""

    def __init__(self, entries: list[os.DirEntry[str]]) -> None:
        self.entries = entries

    def __enter__(self) -> list[os.DirEntry[str]]:
        return self.entries

    def __exit__(self, *_: object) -> None:
        return None


def test_a_container_swapping_a_symlink_in_cannot_steer_the_removal_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: while the agent removes a run dir the container still has mounted, the
    container swaps a directory the agent has just listed for a symlink to a directory
    outside (another container's, the boards). A walk by path then gave that directory
    and everything below it new permissions; the walk by descriptor never leaves the tree.
    The container's move is made right after the agent lists ``run/a`` (its timing, made
    certain here)."""
    victim = tmp_path / "victim"
    (victim / "b" / "c").mkdir(parents=True)
    run = tmp_path / "run"
    (run / "a" / "b" / "c").mkdir(parents=True)
    for d in (victim, victim / "b", victim / "b" / "c"):
        d.chmod(0o751)
    real_scandir = os.scandir
    swapped = []

    def scandir_then_swap(target: Any) -> _Listed:
        with real_scandir(target) as listing:
            entries = list(listing)
        if {e.name for e in entries} == {"b"} and not swapped:  # run/a, just listed
            (run / "a").rename(run / "a-was")
            (run / "a").symlink_to(victim)
            swapped.append(True)
        return _Listed(entries)

    monkeypatch.setattr(os, "scandir", scandir_then_swap)
    remove_container_tree(run)
    monkeypatch.undo()
    assert swapped
    modes = {d.name: stat.S_IMODE(d.stat().st_mode) for d in victim.rglob("*")}
    assert modes == {"b": 0o751, "c": 0o751}
    assert stat.S_IMODE(victim.stat().st_mode) == 0o751


def _chain(top: Path, depth: int) -> None:
    """A chain of ``depth`` directories below ``top``, a file at its foot, as a container
    makes one (``mkdir d; cd d`` in a loop: no path is ever that long)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(depth):
            os.mkdir("d", dir_fd=fd)
            if level % 100 == 0:
                os.chmod("d", 0, dir_fd=fd)  # locked as it is made: given back by the walk
                os.chmod("d", 0o700, dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        with open(os.open("data", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "wb") as f:
            f.write(b"x" * 4096)
    finally:
        os.close(fd)


def test_a_tree_deeper_than_python_recurses_is_removed_with_few_descriptors(
    tmp_path: Path,
) -> None:
    """The attack: a container an older agent started (its run dir on host disk) makes a
    chain of 1,500 directories. rmtree recursed once per level: RecursionError escaped
    housekeeping and the agent's start (emptying the node directory), so the agent crash-looped and
    served no one on the node. The walk keeps its own stack, and moves what is deeper than
    it holds open up to the top: here within 128 descriptors."""
    run = tmp_path / "run"
    run.mkdir()
    _chain(run, 1500)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    try:
        gone = remove_container_tree(run)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert gone and not run.exists()


def test_a_top_swapped_for_a_symlink_is_removed_not_followed(tmp_path: Path) -> None:
    """A directory an older container could write (the node dir) is listed, then swapped
    for a symlink before its removal starts: the removal gave the link's target new
    permissions. Now the link goes, and the target is untouched."""
    victim = tmp_path / "victim"
    (victim / "b").mkdir(parents=True)
    victim.chmod(0o751)
    swapped = tmp_path / "swapped"
    swapped.symlink_to(victim)
    assert remove_container_tree(swapped)
    assert not os.path.lexists(swapped)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o751 and (victim / "b").is_dir()


def test_a_wide_directory_is_listed_once_not_once_per_subdirectory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: 100,000 empty directories side by side. A walk that lists a directory
    again after emptying each subdirectory of it does quadratic work (10^10 entries read
    here): the agent's housekeeping would spin on one pod's leftovers."""
    run = tmp_path / "run"
    run.mkdir()
    for n in range(2000):
        (run / f"d{n}").mkdir()
    real_scandir = os.scandir
    listings = []

    def counting(target: Any) -> Any:
        listings.append(target)
        return real_scandir(target)

    monkeypatch.setattr(os, "scandir", counting)
    assert remove_container_tree(run)
    assert len(listings) == 2001  # the top once, and each directory once
