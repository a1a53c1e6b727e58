"""The shim with the real driver and PyTorch. Skipped without an NVIDIA GPU.

Run on a GPU host: ``.venv/bin/pytest -m gpu tests/gpu -v``. It builds the shim, writes
per-test limits files for the first GPU and runs PyTorch in subprocesses with the test
build preloaded (per-test paths), as a container would with the production build.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.boards import BoardLoop, BoardPublisher
from fracgpu import shim_abi

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "shim" / "build"
MiB = 1 << 20
GiB = 1 << 30
TOLERANCE = 0.05

pytestmark = pytest.mark.gpu


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


@pytest.fixture(scope="module")
def gpu() -> Gpu:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi: not a GPU machine")
    query = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    if query.returncode != 0 or not query.stdout.strip():
        pytest.skip(f"nvidia-smi found no GPU: {query.stderr.strip()}")
    python = torch_python()
    if python is None:
        pytest.skip("no Python with a CUDA-enabled PyTorch")
    subprocess.run(["make", "-s", "-C", str(REPO / "shim")], check=True, timeout=600)
    uuid, total = (x.strip() for x in query.stdout.splitlines()[0].split(","))
    return Gpu(uuid=uuid, total_mib=int(total), python=python)


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

    def result(self, code: str, preload: bool = True, timeout: float = 300) -> dict[str, object]:
        proc = self.python(code, preload)
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err
        return dict(json.loads(out.strip().splitlines()[-1]))


@pytest.fixture
def box(tmp_path: Path, gpu: Gpu) -> Iterator[Container]:
    c = Container(tmp_path / "c0", gpu)
    c.limit(2 * GiB)
    yield c


def test_mem_get_info_shows_the_slice(box: Container) -> None:
    got = box.result(
        """
        import json, torch
        free, total = torch.cuda.mem_get_info()
        print(json.dumps({"free": free, "total": total}))
        """
    )
    assert got["total"] == 2 * GiB
    assert isinstance(got["free"], int) and got["free"] <= 2 * GiB


ALLOC = """
import json, sys, torch
torch.cuda.init()
held = []
results = []
for mib in map(int, sys.argv[1:] or {sizes}):
    try:
        held.append(torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda"))
        results.append("ok")
    except torch.cuda.OutOfMemoryError:
        results.append("oom")
print(json.dumps({{"results": results}}), flush=True)
if {hold}:
    sys.stdin.readline()
"""


def test_allocations_within_the_slice_succeed_past_it_fail(box: Container) -> None:
    got = box.result(ALLOC.format(sizes=[1024, 512, 1024], hold=False))
    assert got["results"] == ["ok", "ok", "oom"]


def test_nvidia_smi_shows_the_slice(box: Container) -> None:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        env=box.env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout.split()[0]) == 2048


def test_two_processes_share_one_slice(box: Container) -> None:
    holder = box.python(ALLOC.format(sizes=[1200], hold=True))
    try:
        assert holder.stdout is not None
        assert json.loads(holder.stdout.readline())["results"] == ["ok"]
        other = box.result(ALLOC.format(sizes=[1200, 300], hold=False))
        assert other["results"] == ["oom", "ok"]
    finally:
        holder.communicate("go\n", timeout=60)


MATMUL = """
import json, time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for _ in range(20):
    a @ b
torch.cuda.synchronize()
start = time.monotonic()
n = 0
while time.monotonic() - start < {seconds}:
    for _ in range(10):
        a @ b
    n += 10
torch.cuda.synchronize()
print(json.dumps({{"rate": n / (time.monotonic() - start)}}))
"""


def rate(container: Container, seconds: float = 8, preload: bool = True) -> float:
    value = container.result(MATMUL.format(seconds=seconds), preload=preload)["rate"]
    assert isinstance(value, float)
    return value


def test_thirty_percent_slice_runs_at_thirty_percent(box: Container) -> None:
    full = rate(box, preload=False)
    box.limit(4 * GiB, core=30)
    sliced = rate(box)
    assert abs(sliced / full - 0.30) <= TOLERANCE, (sliced, full)


def test_two_containers_split_twenty_five_seventy_five(tmp_path: Path, gpu: Gpu) -> None:
    small, big = Container(tmp_path / "small", gpu), Container(tmp_path / "big", gpu)
    small.limit(4 * GiB, core=25)
    big.limit(4 * GiB, core=75)
    procs = [c.python(MATMUL.format(seconds=10)) for c in (small, big)]
    rates = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        rates.append(json.loads(out.strip().splitlines()[-1])["rate"])
    share = rates[0] / sum(rates)
    assert abs(share - 0.25) <= TOLERANCE, rates


def test_high_priority_keeps_its_throughput_next_to_low_priority(tmp_path: Path, gpu: Gpu) -> None:
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    high = Container(tmp_path / "high", gpu, node_dir)
    low = Container(tmp_path / "low", gpu, node_dir)
    high.limit(4 * GiB, priority=0)
    low.limit(4 * GiB, priority=1)
    # The agent's board publisher, over these two containers' files.
    boards = BoardLoop(
        BoardPublisher(
            node_dir,
            lambda: [gpu.uuid],
            lambda: [(c.root / "limits", c.root / "region") for c in (high, low)],
        ),
        0.01,
    )
    boards.start()
    try:
        alone = rate(high)
        procs = [c.python(MATMUL.format(seconds=10)) for c in (high, low)]
        rates = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            rates.append(json.loads(out.strip().splitlines()[-1])["rate"])
    finally:
        boards.stop()
    assert rates[0] >= 0.9 * alone, (alone, rates)


# Host fallback: a slice 2 GiB larger than the GPU. The program fills it to 512 MiB short
# of the slice in 256 MiB tensors (the last ones past the GPU's memory come from the
# host), computes on all of them, then asks for 1 GiB more. It reads the region's
# host-backed bytes itself while it still holds everything.
OVERSUBSCRIBE = """
import json, struct, torch
free, total = torch.cuda.mem_get_info()
chunk = 256 << 20
held, filled = [], 0
try:
    while filled + chunk <= total - (512 << 20):
        held.append(torch.ones(chunk // 4, device="cuda"))
        filled += chunk
except torch.cuda.OutOfMemoryError:
    pass
sum_ok = sum(int(t.sum().item()) for t in held) == filled // 4
try:
    torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    beyond = "allocated"
except torch.cuda.OutOfMemoryError:
    beyond = "oom"
region = open({region!r}, "rb").read()
host = struct.unpack_from("<Q", region, {host_off})[0]
print(json.dumps({{"total": total, "filled": filled, "sum_ok": sum_ok, "beyond": beyond,
                  "host": host}}))
"""


@pytest.mark.parametrize("fallback", [True, False])
def test_host_fallback_oversubscribes_the_gpu(box: Container, fallback: bool) -> None:
    slice_bytes = box.gpu.total_mib * MiB + 2 * GiB
    box.limit(slice_bytes, host_fallback=fallback)
    got = box.result(
        OVERSUBSCRIBE.format(
            region=str(box.root / "region"),
            host_off=shim_abi.DEVICES_OFF + shim_abi.DEV_OFF_MEMORY_HOST_USED,
        ),
        timeout=600,
    )
    assert got["sum_ok"] is True
    assert got["beyond"] == "oom"  # never past the slice
    filled, host = got["filled"], got["host"]
    assert isinstance(filled, int) and isinstance(host, int)
    if fallback:
        assert got["total"] == slice_bytes  # the slice, though larger than the GPU
        assert filled == (slice_bytes - 512 * MiB) // (256 * MiB) * (256 * MiB)
        assert host >= 2 * GiB - 512 * MiB - 256 * MiB  # at least what the GPU cannot hold
    else:
        physical = box.gpu.total_mib * MiB  # nvidia-smi's MiB; the driver counts bytes
        assert isinstance(got["total"], int) and abs(got["total"] - physical) <= physical // 100
        assert filled < box.gpu.total_mib * MiB and host == 0
