"""fracgpu-agent as a real process: NVML double, test kubelet, /metrics, SIGTERM."""

import json
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.settings import _parser
from fracgpu import __version__, shim_abi
from fracgpu.names import RESOURCE_VCUDA_CORE, RESOURCE_VCUDA_MEMORY
from tests.agent.agent_process import AgentProcess, write_unused_kubeconfig
from tests.agent.kubelet import TestKubelet
from tests.agent.nvml_double import REPO, NvmlDouble, ensure_shim_built

UUID0 = "GPU-aaaa0000-0000-4000-8000-000000000000"
UUID1 = "GPU-aaaa0000-0000-4000-8000-000000000001"


@pytest.fixture
def double(short_dir: Path) -> NvmlDouble:
    ensure_shim_built()
    fake = NvmlDouble(short_dir)
    fake.configure(
        device_count=2,
        device__0__uuid=UUID0,
        device__0__utilization_gpu=12,
        device__1__uuid=UUID1,
        device__1__memory_bytes=8 << 30,
    )
    return fake


@pytest.fixture
def kubelet(short_dir: Path) -> Iterator[TestKubelet]:
    k = TestKubelet(short_dir / "dp", short_dir / "pr.sock")
    k.start()
    yield k
    k.close()


def _node_a(
    short_dir: Path, double: NvmlDouble, *extra: str, kubeconfig: Path | None = None
) -> AgentProcess:
    """The agent of node-a on the double, without the API (an unused kubeconfig unless
    another is given)."""
    return AgentProcess(
        node="node-a",
        directory=short_dir,
        double=double,
        kubeconfig=kubeconfig or write_unused_kubeconfig(short_dir / "kubeconfig"),
        publish_inventory=False,
        extra=extra,
    )


@pytest.fixture
def agent(short_dir: Path, double: NvmlDouble, kubelet: TestKubelet) -> Iterator[AgentProcess]:
    process = _node_a(short_dir, double)
    yield process
    process.stop()


def _health(devices: dict[str, str], uuid: str) -> set[str]:
    return {h for d, h in devices.items() if d.startswith(uuid)}


def test_agent_serves_kubelet_and_tracks_health(
    agent: AgentProcess, kubelet: TestKubelet, double: NvmlDouble
) -> None:
    core = kubelet.wait_for_plugin(RESOURCE_VCUDA_CORE, timeout=30)
    mem = kubelet.wait_for_plugin(RESOURCE_VCUDA_MEMORY, timeout=30)
    assert len(core.devices) == 200
    assert len(mem.devices) == 16 * 4 + 8 * 4  # 16 GiB and 8 GiB in 256 MiB units
    installed = list(agent.lib_dir.glob("libfracgpu-*.so"))
    assert len(installed) == 1 and (agent.lib_dir / "ld.so.preload").is_file()

    # A critical XID makes GPU 0 unhealthy; after the quiet period it is healthy again.
    seen = core.updates
    double.xid(UUID0, 79)
    devices = kubelet.wait_for_update(RESOURCE_VCUDA_CORE, seen, timeout=20)
    assert _health(devices, UUID0) == {"Unhealthy"} and _health(devices, UUID1) == {"Healthy"}
    seen = kubelet.wait_for_plugin(RESOURCE_VCUDA_CORE).updates
    devices = kubelet.wait_for_update(RESOURCE_VCUDA_CORE, seen, timeout=20)
    assert _health(devices, UUID0) == {"Healthy"}

    # NVML errors on GPU 1 make it unhealthy until it answers again.
    seen = kubelet.wait_for_plugin(RESOURCE_VCUDA_CORE).updates
    double.set("device.1.nvml_error.nvmlDeviceGetMemoryInfo", 15)
    devices = kubelet.wait_for_update(RESOURCE_VCUDA_CORE, seen, timeout=20)
    assert _health(devices, UUID1) == {"Unhealthy"}
    seen = kubelet.wait_for_plugin(RESOURCE_VCUDA_CORE).updates
    double.set("device.1.nvml_error.nvmlDeviceGetMemoryInfo", None)
    devices = kubelet.wait_for_update(RESOURCE_VCUDA_CORE, seen, timeout=20)
    assert _health(devices, UUID1) == {"Healthy"}


def test_agent_exports_metrics(agent: AgentProcess, kubelet: TestKubelet) -> None:
    port = agent.metrics_port()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    assert f'fracgpu_gpu_memory_total_bytes{{gpu="{UUID1}"' in text
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith("fracgpu_gpu_utilization_ratio") and UUID0 in ln
    )
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(0.12)


def test_an_agent_that_cannot_measure_a_context_says_why_and_counts_none(
    short_dir: Path, double: NvmlDouble, kubelet: TestKubelet
) -> None:
    # The double's contexts take no memory (no context_bytes): NVML has nothing to report.
    process = _node_a(short_dir, double, "--context-overhead-bytes=auto")
    try:
        warning = process.wait_log("CUDA context not measured")
        assert warning["gpu"] in (UUID0, UUID1)
        assert "NVML lists no memory for the context probe" in warning["error"]
        error = process.wait_log("CUDA contexts not counted")
        assert error["level"] == "error" and "--context-overhead-bytes" in error["reason"]
        samples = process.scrape()
        assert samples['fracgpu_context_overhead_bytes{node="node-a",source="unmeasured"}'] == 0
    finally:
        process.stop()


def test_agent_stops_cleanly_and_removes_its_sockets(
    agent: AgentProcess, kubelet: TestKubelet
) -> None:
    kubelet.wait_for_plugin(RESOURCE_VCUDA_CORE, timeout=30)
    sockets = sorted(p.name for p in agent.plugin_dir.iterdir() if p.name != "kubelet.sock")
    assert sockets == ["fracgpu-vcuda-core.sock", "fracgpu-vcuda-memory.sock"]
    assert agent.stop() == 0
    assert sorted(p.name for p in agent.plugin_dir.iterdir()) == ["kubelet.sock"]
    assert any(entry.get("msg") == "stopped" for entry in agent.logs)


def test_agent_refuses_bad_settings(short_dir: Path, double: NvmlDouble) -> None:
    process = _node_a(short_dir, double, "--metrics-port=70000")
    assert process.proc.wait(30) == 2
    process.stop()
    assert "--metrics-port=70000 is not allowed" in "".join(process.raw)


def test_discover_command_prints_what_nvml_reports(double: NvmlDouble) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agent.cli", "discover"],
        cwd=REPO,
        env={**os.environ, **double.env(), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(result.stdout)
    assert [d["uuid"] for d in report["devices"]] == [UUID0, UUID1]
    assert report["devices"][1]["memoryMiB"] == 8192
    assert report["devices"][0]["usage"]["utilization_percent"] == 12
    assert report["driverVersion"] and report["cudaDriverVersion"]


def _discover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "discover", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_discover_answers_help_and_version_without_asking_nvml() -> None:
    # No NVML here: running discovery would fail with exit code 1.
    for flag in ("--help", "-h"):
        result = _discover(flag)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("usage: fracgpu-agent discover")
        assert "as JSON" in result.stdout
    result = _discover("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"fracgpu-agent {__version__}")


@pytest.mark.parametrize("extra", [["--node-name", "x"], ["devices"]])
def test_discover_rejects_other_arguments(extra: list[str]) -> None:
    result = _discover(*extra)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"fracgpu-agent discover: unexpected argument {extra[0]!r}: "
        "discover takes none, only --help or --version"
    )
    assert result.stdout == ""


def test_agent_with_a_malformed_kubeconfig_says_where(short_dir: Path, double: NvmlDouble) -> None:
    broken = short_dir / "kubeconfig"
    broken.write_text("clusters: [\n")
    process = _node_a(short_dir, double, kubeconfig=broken)
    assert process.proc.wait(60) == 1
    process.stop()
    entry = next(e for e in process.logs if e.get("msg") == "agent cannot start")
    assert f"from {broken}: not valid YAML at line 2, column 1" in entry["error"]
    assert not any("Traceback" in line for line in process.raw)


def test_agent_without_credentials_says_so(short_dir: Path, double: NvmlDouble) -> None:
    process = _node_a(short_dir, double, kubeconfig=short_dir / "missing-kubeconfig")
    assert process.proc.wait(60) == 1
    process.stop()
    entry = next(e for e in process.logs if e.get("msg") == "agent cannot start")
    assert "cannot load Kubernetes credentials" in entry["error"]
    assert "--kubeconfig" in entry["error"]


def test_agent_publishes_a_board_per_gpu_read_only_to_containers(
    agent: AgentProcess, kubelet: TestKubelet
) -> None:
    """The running agent keeps one board per GPU fresh in the node directory (what the
    device plugin mounts read-only into containers)."""
    kubelet.wait_for_plugin(RESOURCE_VCUDA_CORE, timeout=30)
    boards = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(boards) < 2:
        boards = {
            p.name: shim_abi.decode_board(p.read_bytes())
            for p in agent.node_dir.iterdir()
            if p.is_file() and p.stat().st_size == shim_abi.BOARD_SIZE
        }
        time.sleep(0.1)
    assert set(boards) == {UUID0, UUID1}
    assert stat.S_IMODE(agent.node_dir.stat().st_mode) == 0o755
    first = boards[UUID0]
    time.sleep(0.3)
    again = shim_abi.decode_board((agent.node_dir / UUID0).read_bytes())
    assert again.sequence > first.sequence  # rewritten in place, again and again
    assert 0 < time.monotonic_ns() - again.published_ns < shim_abi.BOARD_STALE_NS


def _probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_agent_without_kubelet_says_so_and_is_not_ready_until_kubelet_appears(
    short_dir: Path, double: NvmlDouble
) -> None:
    process = _node_a(short_dir, double)
    kubelet = TestKubelet(short_dir / "dp", short_dir / "pr.sock")
    try:
        port = process.metrics_port()
        entry = process.wait_log("not ready")
        assert f"{short_dir / 'dp' / 'kubelet.sock'} does not exist" in entry["reason"]
        assert "--device-plugin-dir" in entry["reason"]
        status, body = _probe(port, "/readyz")
        assert status == 503 and "does not exist" in body
        assert _probe(port, "/healthz")[0] == 200

        kubelet.start()
        kubelet.wait_for_plugin(RESOURCE_VCUDA_CORE, timeout=30)
        kubelet.wait_for_plugin(RESOURCE_VCUDA_MEMORY, timeout=30)
        deadline = time.monotonic() + 20
        while (answer := _probe(port, "/readyz"))[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert answer[0] == 200 and "registered with kubelet" in answer[1]
        assert "fracgpu_gpu_memory_total_bytes" in _probe(port, "/metrics")[1]
    finally:
        process.stop()
        kubelet.close()


def test_help_documents_every_flag_and_version_answers() -> None:
    for flag in ("--help", "--version"):
        result = subprocess.run(
            [sys.executable, "-m", "agent.cli", flag],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "invalid command line" not in result.stderr
    assert result.stdout.strip() == f"fracgpu-agent {__version__}"
    undocumented = [
        a.option_strings[0]
        for a in _parser()._actions
        if a.option_strings and not (a.help or "").strip()
    ]
    assert undocumented == []
