"""Certificate files on disk: atomic plain writes and the kubelet's Secret volume layout."""

from __future__ import annotations

import os
import re
import stat
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from certs import files
from certs.errors import CertsError


def test_write_files_replaces_each_file_whole_and_private(tmp_path: Path) -> None:
    target = tmp_path / "tls"
    files.write_files(target, {"tls.crt": b"cert-1", "tls.key": b"key-1"})
    files.write_files(target, {"tls.crt": b"cert-2", "tls.key": b"key-2"})
    assert (target / "tls.crt").read_bytes() == b"cert-2"
    assert (target / "tls.key").read_bytes() == b"key-2"
    assert stat.S_IMODE((target / "tls.key").stat().st_mode) == 0o600
    assert sorted(p.name for p in target.iterdir()) == ["tls.crt", "tls.key"]  # no temp files


@pytest.mark.parametrize("bad", ["", "a/b", ".hidden", "..data"])
def test_file_names_that_could_escape_or_clash_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(CertsError, match="is not allowed: use a plain name"):
        files.project(tmp_path, {bad: b"x"})
    with pytest.raises(CertsError, match="is not allowed"):
        files.write_files(tmp_path, {bad: b"x"})


def test_projection_has_the_kubelet_layout(tmp_path: Path) -> None:
    when = datetime(2026, 11, 22, 2, 30, 0, tzinfo=UTC)
    generation = files.project(tmp_path, {"tls.crt": b"c1", "tls.key": b"k1"}, now=when)
    assert re.fullmatch(r"\.\.2026_11_22_02_30_00\.\d{9}", generation.name)
    assert generation.is_dir() and not generation.is_symlink()
    assert os.readlink(tmp_path / "..data") == generation.name
    assert os.readlink(tmp_path / "tls.crt") == "..data/tls.crt"
    assert os.readlink(tmp_path / "tls.key") == "..data/tls.key"
    assert (tmp_path / "tls.crt").read_bytes() == b"c1"
    assert stat.S_IMODE((generation / "tls.key").stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["..data", generation.name, "tls.crt", "tls.key"]
    )


def test_an_update_swaps_data_and_removes_the_previous_generation(tmp_path: Path) -> None:
    first = files.project(tmp_path, {"tls.crt": b"c1", "tls.key": b"k1", "old.txt": b"o"})
    crt_link_inode = (tmp_path / "tls.crt").lstat().st_ino
    second = files.project(tmp_path, {"tls.crt": b"c2", "tls.key": b"k2"})
    assert second != first and not first.exists()
    assert os.readlink(tmp_path / "..data") == second.name
    assert (tmp_path / "tls.crt").read_bytes() == b"c2"
    assert (tmp_path / "tls.key").read_bytes() == b"k2"
    # The visible names stay the same symlinks; only ..data moved.
    assert (tmp_path / "tls.crt").lstat().st_ino == crt_link_inode
    assert not (tmp_path / "old.txt").exists() and not (tmp_path / "old.txt").is_symlink()
    assert not (tmp_path / "..data_tmp").exists()


def test_a_reader_resolving_data_once_always_sees_a_matching_pair(tmp_path: Path) -> None:
    files.project(tmp_path, {"tls.crt": b"0", "tls.key": b"0"})
    stop = threading.Event()
    mismatches: list[tuple[bytes, bytes]] = []
    reads = 0

    def read_pairs() -> None:
        nonlocal reads
        while not stop.is_set():
            try:
                generation = tmp_path / os.readlink(tmp_path / "..data")
                pair = (
                    (generation / "tls.crt").read_bytes(),
                    (generation / "tls.key").read_bytes(),
                )
            except FileNotFoundError:
                continue  # the generation was removed after we resolved it: read again
            reads += 1
            if pair[0] != pair[1]:
                mismatches.append(pair)

    reader = threading.Thread(target=read_pairs)
    reader.start()
    try:
        for n in range(1, 200):
            value = str(n).encode()
            files.project(tmp_path, {"tls.crt": value, "tls.key": value})
    finally:
        stop.set()
        reader.join()
    assert reads > 0
    assert mismatches == []
    assert (tmp_path / "tls.crt").read_bytes() == b"199"
