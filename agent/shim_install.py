"""Install the shim library shipped in the agent image into the host directory.

The installed name carries a hash of the content (``libfracgpu-<sha256[:16]>.so``), so a
new agent version adds a file instead of changing one that running containers have
mounted; the copy is written to a temporary name and renamed, so a container never sees a
half-written library. The preload file names the library's in-container path, which does
not change.
"""

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

from agent.atomic import write_atomically
from fracgpu.names import CONTAINER_LIBRARY_PATH

log = logging.getLogger(__name__)

PRELOAD_FILE = "ld.so.preload"


class ShimInstallError(Exception):
    """The shim library cannot be installed; says which path and why."""


@dataclass(frozen=True)
class InstalledShim:
    library: Path
    preload: Path


def versioned_name(content: bytes) -> str:
    return f"libfracgpu-{hashlib.sha256(content).hexdigest()[:16]}.so"


def install_shim(source: Path, host_dir: Path) -> InstalledShim:
    try:
        content = source.read_bytes()
    except OSError as error:
        raise ShimInstallError(
            f"cannot read the shim library {source}: {error.strerror}; "
            "set --shim-source to the libfracgpu.so shipped in the agent image"
        ) from None
    if not content.startswith(b"\x7fELF"):
        raise ShimInstallError(f"{source} is not a shared library (no ELF header)")
    target = host_dir / versioned_name(content)
    try:
        if not (target.is_file() and target.read_bytes() == content):
            write_atomically(target, content, 0o555)
            log.info("shim installed", extra={"path": str(target)})
        preload = host_dir / PRELOAD_FILE
        wanted = (CONTAINER_LIBRARY_PATH + "\n").encode()
        if not (preload.is_file() and preload.read_bytes() == wanted):
            write_atomically(preload, wanted, 0o444)
    except OSError as error:
        raise ShimInstallError(f"cannot write into {host_dir}: {error}") from None
    return InstalledShim(library=target, preload=preload)
