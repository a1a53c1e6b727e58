"""Per-allocation host files: fresh per allocation, atomic limits, never yanked from a holder."""

import os
import stat
from pathlib import Path

from agent.hostfiles import AllocationFiles, allocation_key


def test_key_depends_on_resource_and_id_set_only() -> None:
    a = allocation_key("tencent.com/vcuda-core", ["x-core-2", "x-core-1"])
    assert a == allocation_key("tencent.com/vcuda-core", ["x-core-1", "x-core-2"])
    assert a != allocation_key("tencent.com/vcuda-memory", ["x-core-1", "x-core-2"])
    assert a != allocation_key("tencent.com/vcuda-core", ["x-core-1"])
    assert a.startswith("vcuda-core-")


def test_limits_are_read_only_and_replaced_whole(tmp_path: Path) -> None:
    files = AllocationFiles(tmp_path)
    files.prepare("k")
    files.write_limits("k", "version=1\nfirst\n")
    before = os.stat(files.limits_path("k")).st_ino
    files.write_limits("k", "version=1\nsecond\n")
    assert files.read_limits("k") == "version=1\nsecond\n"
    assert os.stat(files.limits_path("k")).st_ino != before  # renamed over, not rewritten
    assert stat.S_IMODE(os.stat(files.limits_path("k")).st_mode) == 0o444
    assert sorted(p.name for p in files.directory("k").iterdir()) == ["limits", "run"]


def test_a_directory_left_at_the_limits_path_is_replaced(tmp_path: Path) -> None:
    files = AllocationFiles(tmp_path)
    files.prepare("k")
    files.limits_path("k").mkdir()  # what a runtime does for a missing bind-mount source
    files.write_limits("k", "version=1\n")
    assert files.limits_path("k").is_file()


def test_reallocation_leaves_the_previous_holders_files_alone(tmp_path: Path) -> None:
    files = AllocationFiles(tmp_path)
    files.prepare("k")
    files.write_limits("k", "version=1\n")
    region = files.region_path("k")
    region.write_bytes(b"old holder's region")
    with region.open("rb") as still_open:
        files.prepare("k")
        assert files.read_limits("k") is None
        assert not files.region_path("k").exists()
        assert files.run_dir("k").is_dir()
        assert stat.S_IMODE(os.stat(files.run_dir("k")).st_mode) == 0o777
        assert still_open.read() == b"old holder's region"
    (aside,) = files.directory("k").glob("run.old-*")
    assert (aside / "region").read_bytes() == b"old holder's region"
    files.prepare("k")  # the one before the previous is removed
    assert not aside.exists()
