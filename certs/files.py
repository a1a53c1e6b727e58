"""Write certificate files to a directory: plainly (each file atomically) or the way the
kubelet projects a Secret volume (all files swapped at once through a `..data` symlink).

The projected layout, which the webhook's hot reload must handle, is:

    ..2026_11_22_02_30_00.123456789/tls.crt   the current generation (a real directory)
    ..data -> ..2026_11_22_02_30_00.123456789  swapped atomically by rename(2)
    tls.crt -> ..data/tls.crt                  stable names, created once

An update writes a new timestamped directory, points a `..data_tmp` symlink at it, renames
that over `..data`, and removes the previous generation, so a reader that resolves `..data`
once always sees a consistent tls.crt/tls.key pair.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from .errors import CertsError

DATA_LINK = "..data"
_DATA_TMP_LINK = "..data_tmp"
_TIMESTAMP_FORMAT = "..%Y_%m_%d_%H_%M_%S."


def _check_names(files: Mapping[str, bytes]) -> None:
    for name in files:
        if not name or "/" in name or name.startswith(".") or name in (".", ".."):
            raise CertsError(
                f"file name {name!r} is not allowed: use a plain name without '/' that does "
                "not start with '.' (e.g. tls.crt)"
            )


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data` in one step: readers see the old or the new file, whole."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def write_files(directory: Path, files: Mapping[str, bytes], mode: int = 0o600) -> None:
    """Each file replaced atomically (not the set as one: use `project` for that)."""
    _check_names(files)
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_atomic(directory / name, data, mode)


def project(
    directory: Path,
    files: Mapping[str, bytes],
    now: datetime | None = None,
    mode: int = 0o644,
) -> Path:
    """Swap in `files` exactly like the kubelet updates a Secret volume; returns the new
    generation directory. Files missing from `files` disappear from the visible names."""
    _check_names(files)
    directory.mkdir(parents=True, exist_ok=True)
    data_link = directory / DATA_LINK
    previous = os.readlink(data_link) if data_link.is_symlink() else None

    generation = _new_generation_dir(directory, now or datetime.now(UTC))
    for name, data in files.items():
        path = generation / name
        with open(path, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        path.chmod(mode)
    _fsync_directory(generation)

    tmp_link = directory / _DATA_TMP_LINK
    tmp_link.unlink(missing_ok=True)
    os.symlink(generation.name, tmp_link)
    os.replace(tmp_link, data_link)  # the one atomic step: ..data now names the new files
    _fsync_directory(directory)

    for name in files:
        visible = directory / name
        if not visible.is_symlink():
            os.symlink(f"{DATA_LINK}/{name}", visible)
    for entry in directory.iterdir():
        if (
            not entry.name.startswith(".")
            and entry.is_symlink()
            and os.readlink(entry).startswith(f"{DATA_LINK}/")
            and entry.name not in files
        ):
            entry.unlink()
    if previous is not None and previous != generation.name:
        _remove_generation(directory / previous)
    return generation


def _new_generation_dir(directory: Path, now: datetime) -> Path:
    prefix = now.astimezone(UTC).strftime(_TIMESTAMP_FORMAT)
    while True:
        candidate = directory / f"{prefix}{secrets.randbelow(10**9):09d}"
        try:
            candidate.mkdir(mode=0o755)
        except FileExistsError:
            continue
        return candidate


def _remove_generation(path: Path) -> None:
    if not path.is_dir() or path.is_symlink() or not path.name.startswith(".."):
        return
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
