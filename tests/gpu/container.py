"""A container on the real GPU: its limits file, region and node directory, and Python
programs run in it with the test build of the shim preloaded (per-test paths), as a
container would run with the production build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from fracgpu import shim_abi

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "shim" / "build"
MiB = 1 << 20
GiB = 1 << 30


def torch_python() -> str | None:
    for candidate in (sys.executable, shutil.which("python3"), shutil.which("python")):
        if (
            candidate
            and subprocess.run(
                [candidate, "-c", "import torch; assert torch.cuda.is_available()"],
                capture_output=True,
                check=False,
            ).returncode
            == 0
        ):
            return candidate
    return None


@dataclass(frozen=True)
class Gpu:
    uuid: str
    total_mib: int
    python: str


@dataclass
class Container:
    root: Path
    gpu: Gpu

    node_dir: Path | None = None

    def limit(
        self, memory: int, core: int = 100, priority: int = 1, host_fallback: bool = False
    ) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "limits").write_bytes(
            shim_abi.encode_limits(
                shim_abi.Limits(
                    devices=(shim_abi.DeviceLimits(self.gpu.uuid, memory, core),),
                    priority=priority,
                    memory_host_fallback=host_fallback,
                )
            )
        )

    def env(self, preload: bool = True) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FRACGPU_")}
        env.pop("LD_PRELOAD", None)
        env["CUDA_VISIBLE_DEVICES"] = self.gpu.uuid
        if preload:
            env.update(
                LD_PRELOAD=str(BUILD / "libfracgpu-test.so"),
                FRACGPU_TEST_LIMITS_PATH=str(self.root / "limits"),
                FRACGPU_TEST_REGION_PATH=str(self.root / "region"),
                FRACGPU_TEST_NODE_DIR=str(self.node_dir or self.root / "no-node-dir"),
                # warnings and errors reach the test's failure message through stderr
                FRACGPU_LOG_LEVEL="warn",
            )
        return env

    def python(self, code: str, preload: bool = True) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [self.gpu.python, "-c", textwrap.dedent(code)],
            env=self.env(preload),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, code: str, preload: bool = True, timeout: float = 300) -> tuple[int, str]:
        """Exit status and output (stdout, then stderr) of ``code``."""
        proc = self.python(code, preload)
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out + err

    def lines(self, code: str, timeout: float = 300) -> list[str]:
        """What ``code`` prints under the shim, line by line; it must exit 0."""
        proc = self.python(code)
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, out + err
        return out.splitlines()

    def program(
        self, name: str, *args: str, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """One of the shim's test programs (shim/build/tests) on the real driver, preloaded."""
        return subprocess.run(
            [str(BUILD / "tests" / name), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def imports(self, module: str) -> bool:
        """Whether the container's Python has ``module``."""
        found = subprocess.run(
            [self.gpu.python, "-c", f"import {module}"], capture_output=True, check=False
        )
        return found.returncode == 0

    def result(self, code: str, preload: bool = True, timeout: float = 300) -> dict[str, object]:
        return finished_json(self.python(code, preload), timeout)


def finished_json(proc: subprocess.Popen[str], timeout: float = 300) -> dict[str, object]:
    """The last line a program printed, as JSON, once it has exited 0: also for programs
    started together and waited for one by one."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return dict(json.loads(out.strip().splitlines()[-1]))
