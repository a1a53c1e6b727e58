"""A per-test fake GPU node for the shim: test doubles, limits file and region.

Programs run as real processes with the test build of the shim preloaded, the
libcuda/libnvidia-ml test doubles on the library path, and per-test paths for
the limits file and region (only the test build honours those variables).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from agent.boardfiles import BoardFiles
from agent.boards import BoardLoop, BoardPublisher, BoardSource, at
from fracgpu import shim_abi

REPO = Path(__file__).resolve().parents[2]
SHIM_DIR = REPO / "shim"
BUILD = SHIM_DIR / "build"
GiB = 1 << 30
MiB = 1 << 20
UUIDS = tuple(f"GPU-fa4e0000-0000-4000-8000-{i:012x}" for i in range(4))


def build_shim() -> Path:
    """Build (or bring up to date) everything under shim/build."""
    made = subprocess.run(
        ["make", "-s", "-C", str(SHIM_DIR)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if made.returncode != 0:
        raise RuntimeError(f"make -C shim failed:\n{made.stdout}\n{made.stderr}")
    return BUILD


def steps(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.strip()]


def step(stdout: str, name: str, index: int = 0) -> list[str]:
    found = [s for s in steps(stdout) if s[0] == name]
    assert len(found) > index, f"no step {name!r} #{index} in output:\n{stdout}"
    return found[index]


@dataclass
class Sandbox:
    """Files of one fake node and one container on it."""

    root: Path
    device_memory: int = 4 * GiB
    device_count: int = 1
    context_bytes: int = 0
    fake_extra: list[str] = field(default_factory=list)
    boards: BoardLoop | None = None

    @property
    def limits_path(self) -> Path:
        return self.root / "limits"

    @property
    def region_path(self) -> Path:
        return self.root / "region"

    @property
    def node_dir(self) -> Path:
        """Priority boards; tests that want priority call publish_boards()."""
        return self.root / "node"

    def board_sources(self) -> list[BoardSource]:
        """Every container of this node: root/limits and root/<name>/limits, each with
        the region next to it."""
        return [(p, at(p.parent / "region")) for p in sorted(self.root.glob("**/limits"))]

    def publish_boards(self, interval_seconds: float = 0.01) -> None:
        """Run the agent's board publisher over this node, as the agent does."""
        self.node_dir.mkdir(exist_ok=True)
        publisher = BoardPublisher(
            BoardFiles(self.node_dir), lambda: UUIDS[: self.device_count], self.board_sources
        )
        publisher.publish()
        self.boards = BoardLoop(publisher, interval_seconds)
        self.boards.start()

    def stop_boards(self) -> None:
        if self.boards is not None:
            self.boards.stop()
            self.boards = None

    @property
    def fake_config(self) -> Path:
        return self.root / "fake-gpu.conf"

    @property
    def events_file(self) -> Path:
        return self.root / "xid-events"

    def write_fake_config(self) -> None:
        lines = [
            f"state_file={self.root / 'fake-gpu.state'}",
            f"events_file={self.events_file}",
            f"device_count={self.device_count}",
            f"context_bytes={self.context_bytes}",
        ]
        for i in range(self.device_count):
            lines += [
                f"device.{i}.uuid={UUIDS[i]}",
                f"device.{i}.memory_bytes={self.device_memory}",
            ]
        self.fake_config.write_text("\n".join(lines + self.fake_extra) + "\n")

    def write_limits(
        self,
        memory: int = GiB,
        core: int = 100,
        devices: int = 1,
        **extra: object,
    ) -> shim_abi.Limits:
        limits = shim_abi.Limits(
            devices=tuple(shim_abi.DeviceLimits(UUIDS[i], memory, core) for i in range(devices)),
            namespace="ns",
            pod="pod",
            container="main",
            **extra,  # type: ignore[arg-type]
        )
        self.limits_path.write_bytes(shim_abi.encode_limits(limits))
        return limits

    def env(
        self,
        lookup: str = "direct",
        preload: str | None = "libfracgpu-test.so",
        extra: dict[str, str] | None = None,
        region: Path | None = None,
    ) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FRACGPU_")}
        env.update(
            LD_LIBRARY_PATH=str(BUILD / "doubles"),
            FRACGPU_FAKE_GPU_CONFIG=str(self.fake_config),
            FRACGPU_TEST_LIMITS_PATH=str(self.limits_path),
            FRACGPU_TEST_REGION_PATH=str(region or self.region_path),
            FRACGPU_TEST_NODE_DIR=str(self.node_dir),
            FRACGPU_T_LOOKUP=lookup,
        )
        env.pop("LD_PRELOAD", None)
        if preload:
            env["LD_PRELOAD"] = str(BUILD / preload)
        env.update(extra or {})
        return env

    def run(
        self, program: str, *args: str, timeout: float = 60, **env_args: object
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BUILD / "tests" / program), *args],
            env=self.env(**env_args),  # type: ignore[arg-type]
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self, program: str, *args: str, **env_args: object) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(BUILD / "tests" / program), *args],
            env=self.env(**env_args),  # type: ignore[arg-type]
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def region(self, path: Path | None = None) -> shim_abi.Region:
        return shim_abi.decode_region((path or self.region_path).read_bytes())


def wait_for(proc: subprocess.Popen[str], word: str) -> list[str]:
    """Read the process's output up to the line starting with word."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(word):
            return seen
    raise AssertionError(f"process ended before {word!r}: {''.join(seen)}")


def can_make_mount_namespaces() -> bool:
    """Whether this process may make a private mount namespace (root, and unshare there)."""
    probe = ["unshare", "--mount", "--propagation", "private", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10, check=False).returncode == 0
    except FileNotFoundError:
        return False
