"""fracgpu-shim run: run any program inside a GPU slice, without Kubernetes.

    fracgpu-shim run --memory 1Gi --cores 30 [--gpus 0,1] [--fake-gpus N] -- python train.py

The limits file is built and written exactly as the agent writes a container's
(``agent.limits.render_limits``, ``agent.atomic.write_atomically``), into a private temporary
directory together with the accounting region; the program runs with the shim preloaded and
the directory is removed when it ends. With ``--fake-gpus N`` the program gets the simulated
driver (shim/testdoubles) with N GPUs of its own; without, the system's NVIDIA driver.

This is a slice for a cooperative program on the user's own machine, not a sandbox: it uses
the shim build whose file paths come from the environment (the production library reads only
the paths the device plugin mounts read-only), and a program can unset its environment.
"""

import argparse
import ctypes
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from agent.atomic import write_atomically
from agent.discovery import discover
from agent.limits import render_limits
from agent.nvml_backend import NvmlError, PynvmlBackend
from agent.supervise import SpawnError, run_child
from fracgpu import __version__
from fracgpu.errors import QuantityError
from fracgpu.names import CORES_PER_GPU
from fracgpu.quantity import parse_quantity
from fracgpu.shim_abi import MAX_DEVICES, DeviceLimits, Limits

PROG = "fracgpu-shim"
VERSION = f"{PROG} {__version__}"
EXIT_USAGE = 2
EXIT_SETUP = 1
MiB = 1 << 20
TEST_LIBRARY = "libfracgpu-test.so"
DOUBLES = "doubles"
DRIVER = "libcuda.so.1"
NVML = "libnvidia-ml.so.1"
FAKE_DEFAULT_MEMORY = "16Gi"
# The shim build of a checkout: <repo>/shim/build next to this package.
CHECKOUT_BUILD = Path(__file__).resolve().parents[1] / "shim" / "build"
# Variables this command sets for the test build of the shim and the driver double.
ENV_LIMITS = "FRACGPU_TEST_LIMITS_PATH"
ENV_REGION = "FRACGPU_TEST_REGION_PATH"
ENV_NODE_DIR = "FRACGPU_TEST_NODE_DIR"
ENV_FAKE_CONFIG = "FRACGPU_FAKE_GPU_CONFIG"
ENV_VISIBLE = "CUDA_VISIBLE_DEVICES"
_UUID = re.compile(r"GPU-[0-9A-Za-z-]{1,60}")
_SIZE_HELP = "a size such as 512Mi, 1Gi or 1500M (bytes, with Ki/Mi/Gi/Ti or k/M/G/T)"


class RunError(Exception):
    """A flag or the machine does not allow the run; the message says what and what to do."""


@dataclass(frozen=True)
class RunSettings:
    memory_bytes: int
    cores: int
    gpus: tuple[str, ...]  # as given: indexes or UUIDs; empty = GPU 0
    fake_gpus: int  # 0: the system's driver
    fake_gpu_memory_bytes: int
    shim_build: Path | None
    command: tuple[str, ...]


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    memory_bytes: int
    mig_enabled: bool = False


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise RunError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=f"{PROG} run",
        usage=f"{PROG} run --memory SIZE [--cores PERCENT] [--gpus LIST] "
        "[--fake-gpus N [--fake-gpu-memory SIZE]] [--shim-build DIR] -- PROGRAM [ARG ...]",
        description="Run a program inside a GPU slice (memory and compute) without Kubernetes.",
        epilog="The program and its arguments follow `--`.",
    )
    parser.add_argument("--version", action="version", version=VERSION)
    parser.add_argument("--memory", required=True, help=f"memory slice per GPU: {_SIZE_HELP}")
    parser.add_argument("--cores", default="100", help="compute slice per GPU, percent 1..100")
    parser.add_argument(
        "--gpus",
        default=None,
        help="GPUs, comma-separated indexes (nvidia-smi's) or UUIDs; default GPU 0",
    )
    parser.add_argument(
        "--fake-gpus",
        default="0",
        metavar="N",
        help=f"simulate N GPUs (0..{MAX_DEVICES}) with the driver double of shim/testdoubles "
        "instead of the system's driver; 0, the default, uses the system's driver",
    )
    parser.add_argument(
        "--fake-gpu-memory",
        default=None,
        help=f"memory of each simulated GPU ({_SIZE_HELP}); default {FAKE_DEFAULT_MEMORY}",
    )
    parser.add_argument(
        "--shim-build",
        default=None,
        type=Path,
        help=f"directory holding {TEST_LIBRARY} and doubles/ (default: the checkout's shim/build)",
    )
    return parser


def _size(flag: str, raw: str) -> int:
    try:
        value = parse_quantity(raw)
    except QuantityError:
        raise RunError(f"{flag} {raw!r} is not a size: use {_SIZE_HELP}") from None
    if value.denominator != 1 or value < 1 or value >= 2**64:
        raise RunError(f"{flag} {raw!r} is not a whole number of bytes above 0: use {_SIZE_HELP}")
    return int(value)


def readable_size(n: int) -> str:
    """Bytes for people: 1073741824 -> "1 GiB", 1000000000 -> "953.7 MiB"."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def _int_in(flag: str, raw: str, low: int, high: int) -> int:
    if not raw.isascii() or not raw.isdigit() or not low <= int(raw) <= high:
        raise RunError(f"{flag} {raw!r} is not allowed: use a whole number {low}..{high}")
    return int(raw)


def parse_args(argv: Sequence[str]) -> RunSettings:
    """``run [options] -- program args...``, every value checked."""
    if list(argv[:1]) == ["--version"]:
        print(VERSION)
        raise SystemExit(0)
    if list(argv[:1]) in (["-h"], ["--help"]):
        _parser().print_help()
        raise SystemExit(0)
    if not argv or argv[0] != "run":
        raise RunError("the only command is `run`: fracgpu-shim run --memory 1Gi -- PROGRAM ...")
    rest = list(argv[1:])
    options = rest[: rest.index("--") if "--" in rest else None]
    if any(a in ("-h", "--help", "--version") for a in options):
        _parser().parse_args(options)  # prints the help or the version and exits
    if "--" not in rest:
        raise RunError("put the program after `--`: fracgpu-shim run --memory 1Gi -- PROGRAM ...")
    split = rest.index("--")
    command = tuple(rest[split + 1 :])
    if not command or not command[0]:
        raise RunError("no program after `--`: fracgpu-shim run --memory 1Gi -- PROGRAM ...")
    args = _parser().parse_args(rest[:split])
    fake_gpus = _int_in("--fake-gpus", args.fake_gpus, 0, MAX_DEVICES)
    if args.fake_gpu_memory is not None and fake_gpus == 0:
        raise RunError("--fake-gpu-memory needs --fake-gpus N")
    gpus = () if args.gpus is None else tuple(args.gpus.split(","))
    if args.gpus is not None and not args.gpus.strip():
        raise RunError(
            f"--gpus {args.gpus!r} names no GPU: use comma-separated indexes (nvidia-smi's) "
            "or UUIDs, or leave --gpus out for GPU 0"
        )
    for gpu in gpus:
        if not (gpu.isascii() and gpu.isdigit()) and not _looks_like_uuid(gpu):
            raise RunError(
                f"--gpus {args.gpus!r}: {gpu!r} is neither a GPU index nor a UUID "
                "(GPU-xxxxxxxx-...); use comma-separated indexes or UUIDs"
            )
    if len(set(gpus)) != len(gpus):
        raise RunError(f"--gpus {args.gpus!r} names a GPU twice")
    return RunSettings(
        memory_bytes=_size("--memory", args.memory),
        cores=_int_in("--cores", args.cores, 1, CORES_PER_GPU),
        gpus=gpus,
        fake_gpus=fake_gpus,
        fake_gpu_memory_bytes=_size(
            "--fake-gpu-memory", args.fake_gpu_memory or FAKE_DEFAULT_MEMORY
        ),
        shim_build=args.shim_build,
        command=command,
    )


def _looks_like_uuid(text: str) -> bool:
    return _UUID.fullmatch(text) is not None


def fake_uuid(index: int) -> str:
    """The driver double's own default UUID for GPU ``index``."""
    return f"GPU-fa4e0000-0000-4000-8000-{index:012x}"


def fake_gpus(settings: RunSettings) -> list[Gpu]:
    return [Gpu(i, fake_uuid(i), settings.fake_gpu_memory_bytes) for i in range(settings.fake_gpus)]


def system_gpus() -> list[Gpu]:
    """The GPUs of the system's driver, as NVML numbers them (nvidia-smi's indexes)."""
    try:
        ctypes.CDLL(DRIVER)
    except OSError:
        raise RunError(
            f"no NVIDIA driver here: {DRIVER} is not on the library path; "
            "use --fake-gpus N to try a slice on the simulated GPU"
        ) from None
    try:
        backend = PynvmlBackend()
        try:
            found = discover(backend)
        finally:
            backend.shutdown()
    except NvmlError as error:
        raise RunError(f"cannot list the GPUs through NVML ({NVML}): {error}") from None
    return [Gpu(d.index, d.uuid, d.memory_mib * MiB, d.mig_enabled) for d in found.devices]


def choose(gpus: Sequence[Gpu], wanted: Sequence[str], memory_bytes: int) -> list[Gpu]:
    """The GPUs ``--gpus`` names (default GPU 0), each able to hold the slice."""
    if not gpus:
        raise RunError("the driver reports no GPU")
    chosen = []
    for name in wanted or ("0",):
        match = [g for g in gpus if (str(g.index) if name.isdigit() else g.uuid) == name]
        if not match:
            have = ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
            raise RunError(f"--gpus: there is no GPU {name}; this machine has {have}")
        chosen.append(match[0])
    if len({g.uuid for g in chosen}) != len(chosen):
        raise RunError("--gpus names one GPU twice (by index and by UUID)")
    for gpu in chosen:
        if gpu.mig_enabled:
            raise RunError(
                f"GPU {gpu.index} ({gpu.uuid}) has MIG enabled: slices of MIG GPUs "
                "are not supported; choose another GPU"
            )
        if memory_bytes > gpu.memory_bytes:
            raise RunError(
                f"--memory {memory_bytes} bytes ({readable_size(memory_bytes)}) is more than "
                f"GPU {gpu.index} has ({gpu.memory_bytes} bytes = "
                f"{readable_size(gpu.memory_bytes)}): ask for at most that, or choose another GPU"
            )
    return chosen


def shim_files(settings: RunSettings) -> tuple[Path, Path | None]:
    """The shim library and, with --fake-gpus, the driver doubles' directory."""
    build = settings.shim_build or CHECKOUT_BUILD
    library = build / TEST_LIBRARY
    how = (
        "build it with `make -C shim` in the fracgpu checkout"
        if settings.shim_build is None
        else "pass --shim-build the shim/build directory of a fracgpu checkout (`make -C shim`)"
    )
    if not library.is_file():
        raise RunError(
            f"the shim library {library} is missing: {how} (the installed "
            "/usr/local/fracgpu/lib/libfracgpu.so reads only the container paths)"
        )
    if not settings.fake_gpus:
        return library, None
    doubles = build / DOUBLES
    for name in (DRIVER, NVML):
        if not (doubles / name).is_file():
            raise RunError(f"the driver double {doubles / name} is missing: {how}")
    return library, doubles


def slice_limits(chosen: Sequence[Gpu], settings: RunSettings) -> Limits:
    """The same limits a pod with this slice on each GPU gets from the agent."""
    return Limits(
        devices=tuple(DeviceLimits(g.uuid, settings.memory_bytes, settings.cores) for g in chosen),
        container="fracgpu-shim-run",
        compute_limit_enabled=settings.cores < CORES_PER_GPU,
    )


def fake_config(gpus: Sequence[Gpu], root: Path) -> str:
    lines = [f"state_file={root / 'fake-gpu.state'}", f"device_count={len(gpus)}"]
    for g in gpus:
        lines += [
            f"device.{g.index}.uuid={g.uuid}",
            f"device.{g.index}.memory_bytes={g.memory_bytes}",
        ]
    return "\n".join(lines) + "\n"


def child_env(
    base: Mapping[str, str],
    root: Path,
    library: Path,
    doubles: Path | None,
    chosen: Sequence[Gpu],
) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in (ENV_LIMITS, ENV_REGION, ENV_NODE_DIR)}
    env[ENV_LIMITS] = str(root / "limits")
    env[ENV_REGION] = str(root / "region")
    env[ENV_NODE_DIR] = str(root / "node")  # no priority board: nobody publishes one
    env["LD_PRELOAD"] = ":".join(filter(None, (str(library), base.get("LD_PRELOAD"))))
    if doubles is not None:
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, (str(doubles), base.get("LD_LIBRARY_PATH"))))
        env[ENV_FAKE_CONFIG] = str(root / "fake-gpu.conf")
    else:
        env[ENV_VISIBLE] = ",".join(g.uuid for g in chosen)
    return env


def run(settings: RunSettings, environ: Mapping[str, str]) -> int:
    library, doubles = shim_files(settings)
    if doubles is None and environ.get(ENV_VISIBLE) is not None:
        raise RunError(
            f"{ENV_VISIBLE} is set: unset it and choose GPUs with --gpus "
            "(indexes as nvidia-smi numbers them, or UUIDs)"
        )
    gpus = fake_gpus(settings) if settings.fake_gpus else system_gpus()
    chosen = choose(gpus, settings.gpus, settings.memory_bytes)
    limits = slice_limits(chosen, settings)
    root = Path(tempfile.mkdtemp(prefix="fracgpu-shim-"))
    try:
        write_atomically(root / "limits", render_limits(limits).encode(), 0o444)
        if doubles is not None:
            (root / "fake-gpu.conf").write_text(fake_config(gpus, root))
        return run_child(settings.command, child_env(environ, root, library, doubles, chosen))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_args(sys.argv[1:] if argv is None else argv)
    except RunError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run(settings, os.environ)
    except SpawnError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return error.exit_code
    except (RunError, OSError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_SETUP


if __name__ == "__main__":
    sys.exit(main())
