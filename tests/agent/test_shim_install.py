"""Installing the shim library on the host: versioned, atomic, old copies kept."""

import contextlib
import os
import threading
from pathlib import Path

import pytest

from agent.shim_install import ShimInstallError, install_shim, versioned_name
from fracgpu.names import CONTAINER_LIBRARY_PATH
from tests.agent.conftest import fake_shim_library


def test_install_is_named_by_content_and_writes_the_preload(tmp_path: Path) -> None:
    source = fake_shim_library(tmp_path / "image" / "libfracgpu.so", b"version one")
    shim = install_shim(source, tmp_path / "host")
    assert shim.library.name == versioned_name(source.read_bytes())
    assert shim.library.read_bytes() == source.read_bytes()
    assert oct(shim.library.stat().st_mode & 0o777) == oct(0o555)
    assert shim.preload.read_text() == CONTAINER_LIBRARY_PATH + "\n"


def test_a_new_version_leaves_the_old_file_to_running_containers(tmp_path: Path) -> None:
    host = tmp_path / "host"
    old = install_shim(fake_shim_library(tmp_path / "a" / "lib.so", b"one"), host)
    old_inode = old.library.stat().st_ino
    new = install_shim(fake_shim_library(tmp_path / "b" / "lib.so", b"two"), host)
    assert new.library != old.library
    assert old.library.stat().st_ino == old_inode
    assert old.library.read_bytes().endswith(b"one")
    assert sorted(p.name for p in host.iterdir()) == sorted(
        [old.library.name, new.library.name, "ld.so.preload"]
    )


def test_reinstalling_the_same_version_changes_nothing(tmp_path: Path) -> None:
    source = fake_shim_library(tmp_path / "image" / "lib.so")
    first = install_shim(source, tmp_path / "host")
    inode = first.library.stat().st_ino
    second = install_shim(source, tmp_path / "host")
    assert second.library.stat().st_ino == inode


def test_readers_never_see_a_partial_library(tmp_path: Path) -> None:
    host = tmp_path / "host"
    payload = os.urandom(4 << 20)
    source = fake_shim_library(tmp_path / "image" / "lib.so", payload)
    target = host / versioned_name(source.read_bytes())
    seen: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):  # between two rounds
                seen.append(len(target.read_bytes()))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(5):
            if target.exists():
                target.unlink()  # force a fresh install each round
            install_shim(source, host)
    finally:
        stop.set()
        thread.join()
    assert seen, "the reader never saw the library"
    assert set(seen) == {len(source.read_bytes())}
    assert not [p for p in host.iterdir() if p.name.endswith(".tmp")]


def test_missing_or_bogus_source_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ShimInstallError, match="cannot read the shim library"):
        install_shim(tmp_path / "nope.so", tmp_path / "host")
    text = tmp_path / "text.so"
    text.write_text("not a library")
    with pytest.raises(ShimInstallError, match="no ELF header"):
        install_shim(text, tmp_path / "host")
