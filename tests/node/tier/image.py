"""The node tier's container image, built here as an OCI image archive (no registry is
reachable): busybox-static for the shell and tools, the host's glibc (the only libc the shim,
the driver stand-in and the probes link against) and the CUDA/NVML probe programs from
shim/build/tests. The same image serves as the pod sandbox ("pause" is busybox sleep).

No driver library is in the image: like a real CUDA image, it gets libcuda.so.1 and
libnvidia-ml.so.1 from the container toolkit at container creation (see runtime.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path

IMAGE = "fracgpu.local/node-test:1"
_ARCH_LIB = "lib/x86_64-linux-gnu"
_DLOPENED = ("libdl.so.2", "libpthread.so.0", "librt.so.1")
_TOOLS = (
    "sh",
    "sleep",
    "cat",
    "echo",
    "ls",
    "test",
    "[",
    "head",
    "tail",
    "wc",
    "grep",
    "env",
    "true",
    "false",
    "stat",
    "dd",
    "id",
    "mount",
    "sed",
    "printf",
    "tr",
)


def _shared_libraries(programs: Iterable[Path]) -> set[Path]:
    """The host libraries the programs load (their ldd closure), by real path."""
    found: set[Path] = set()
    for program in programs:
        out = subprocess.run(
            ["ldd", str(program)], check=True, capture_output=True, text=True
        ).stdout
        for line in out.splitlines():
            parts = line.split()
            # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux..."
            path = parts[2] if len(parts) >= 3 and parts[1] == "=>" else parts[0]
            if path.startswith("/") and Path(path).exists():
                found.add(Path(path))
    return found


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
    tar.addfile(info)


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
    tar.addfile(info)


def _rootfs_layer(
    busybox: Path,
    programs: dict[str, Path],
    closure_of: Iterable[Path],
    mounted: Iterable[Path],
    extra: Iterable[Path],
) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in (
            "bin",
            "etc",
            "lib",
            "lib64",
            "usr",
            "usr/lib",
            f"usr/{_ARCH_LIB}",
            _ARCH_LIB,
            "probes",
            "proc",
            "sys",
            "dev",
            "var",
            "var/run",
        ):
            _add_dir(tar, directory)
        _add_dir(tar, "tmp", 0o1777)
        _add_file(tar, "bin/busybox", busybox.read_bytes(), 0o755)
        for tool in _TOOLS:
            _add_link(tar, f"bin/{tool}", "busybox")
        _add_file(tar, "etc/passwd", b"root:x:0:0:root:/:/bin/sh\n")
        _add_file(tar, "etc/group", b"root:x:0:\n")
        # Libraries inside a directory mounted into the pod (numpy's vendored BLAS in
        # site-packages) are found there through their RUNPATH: no copy in the image.
        carried = [m.resolve() for m in mounted]
        libraries = {
            library
            for library in _shared_libraries([*programs.values(), *closure_of])
            if not any(library.resolve().is_relative_to(m) for m in carried)
        }
        # glibc's compatibility libraries, which programs dlopen by name (cuda-pathfinder
        # opens libdl.so.2) although no binary links them any more.
        libraries |= {p for p in (Path("/", _ARCH_LIB, n) for n in _DLOPENED) if p.exists()}
        libraries |= set(extra)
        for library in sorted(libraries):
            real = library.resolve()
            # The loader is found by its absolute path (/lib64/ld-linux-x86-64.so.2); the
            # rest by name in the multiarch directory, where Debian's ld.so looks.
            inside = str(library).lstrip("/")
            if not inside.startswith(("lib64/", _ARCH_LIB + "/")):
                inside = f"{_ARCH_LIB}/{library.name}"
            _add_file(tar, inside, real.read_bytes(), 0o755)
        for name, program in sorted(programs.items()):
            _add_file(tar, f"probes/{name}", program.read_bytes(), 0o755)
    return out.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def build_image_archive(
    path: Path,
    busybox: Path,
    programs: dict[str, Path],
    closure_of: Iterable[Path] = (),
    mounted: Iterable[Path] = (),
    libraries: Iterable[Path] = (),
) -> Path:
    """Write an OCI image layout archive of IMAGE to `path` (for `ctr images import`).
    `closure_of`: binaries not copied in whose shared libraries the image must still carry
    (a program mounted into the container from the host, and its extension modules), except
    those inside the `mounted` directories, which come with the mount. `libraries`: more
    libraries the image carries itself (the CUDA runtime, as CUDA's runtime images do)."""
    blobs: dict[str, bytes] = {}
    layer = _rootfs_layer(busybox, programs, closure_of, mounted, libraries)
    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(blobs, layer)}
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/bin:/probes"],
            "Cmd": ["/bin/sleep", "2147483647"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_desc = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        **_blob(blobs, config_bytes),
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **_blob(blobs, manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": IMAGE,
                    "org.opencontainers.image.ref.name": IMAGE.rsplit(":", 1)[1],
                },
            }
        ],
    }
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_file(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_file(tar, "index.json", json.dumps(index).encode())
        _add_dir(tar, "blobs")
        _add_dir(tar, "blobs/sha256")
        for digest, data in sorted(blobs.items()):
            _add_file(tar, f"blobs/sha256/{digest.split(':', 1)[1]}", data)
    os.replace(tmp, path)
    return path
