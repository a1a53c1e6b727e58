"""fracgpu-shim run: any program inside a slice, without Kubernetes.

Every run is a real process tree: the command, then the program with the shim preloaded on
the driver double (``--fake-gpus``) or on whatever libcuda.so.1 the system resolves. The CUDA
client is NVIDIA's own ``cuda-bindings`` package and ``pynvml``, not code written here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.shimrun import readable_size
from fracgpu import __version__, shim_abi
from tests.shim.sandbox import BUILD, REPO, GiB, MiB, step

COMMAND = [sys.executable, "-m", "agent.shimrun", "run"]
TOLERANCE = 0.05

# Runs inside the slice: what cuda-bindings and pynvml see, and where allocations stop.
CLIENT = """
import json, os, sys
from cuda.bindings import driver as d
import pynvml

def ok(result):
    err, *rest = result
    return err.name, rest

out = {}
d.cuInit(0)
_, (dev,) = ok(d.cuDeviceGet(0))
_, (ctx,) = ok(d.cuDevicePrimaryCtxRetain(dev))
d.cuCtxSetCurrent(ctx)
_, (free, total) = ok(d.cuMemGetInfo())
out["cu_total"], out["cu_free"] = int(total), int(free)
err, (first,) = ok(d.cuMemAlloc(768 << 20))
out["alloc_768mi"] = err
out["alloc_512mi_more"] = ok(d.cuMemAlloc(512 << 20))[0]
d.cuMemFree(first)
out["alloc_1gi_after_free"] = ok(d.cuMemAlloc(1 << 30))[0]
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
out["nvml_total"] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
out["limits_path"] = os.environ["FRACGPU_TEST_LIMITS_PATH"]
out["visible"] = os.environ.get("CUDA_VISIBLE_DEVICES")
print(json.dumps(out))
"""


def base_env(**extra: str) -> dict[str, str]:
    """The caller's environment without anything that points at a driver or the shim."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FRACGPU_")
        and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")
    }
    env.update(extra)
    return env


def shim_run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        env=env or base_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def client(*flags: str, env: dict[str, str] | None = None) -> dict[str, object]:
    out = shim_run(*flags, "--", sys.executable, "-c", CLIENT, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_a_program_sees_its_slice_and_gets_out_of_memory_past_it(shim_build: Path) -> None:
    seen = client("--fake-gpus", "1", "--memory", "1Gi")
    # The simulated GPU has 16 GiB; the program sees and gets 1 GiB.
    assert seen["cu_total"] == GiB
    assert seen["nvml_total"] == GiB
    assert seen["alloc_768mi"] == "CUDA_SUCCESS"
    assert seen["alloc_512mi_more"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert seen["alloc_1gi_after_free"] == "CUDA_SUCCESS"
    # Its files are gone once it has ended.
    assert not Path(str(seen["limits_path"])).parent.exists()


def test_the_limits_file_is_the_one_the_agent_would_write(shim_build: Path) -> None:
    show = (
        "import os,sys; p=os.environ['FRACGPU_TEST_LIMITS_PATH']; "
        "print(oct(os.stat(p).st_mode & 0o777)); sys.stdout.write(open(p).read())"
    )
    out = shim_run(
        "--fake-gpus",
        "2",
        "--memory",
        "512Mi",
        "--cores",
        "40",
        "--gpus",
        "1",
        "--",
        sys.executable,
        "-c",
        show,
    )
    assert out.returncode == 0, out.stderr
    mode, text = out.stdout.split("\n", 1)
    assert mode == "0o444"
    expected = shim_abi.Limits(
        devices=(shim_abi.DeviceLimits("GPU-fa4e0000-0000-4000-8000-000000000001", 512 * MiB, 40),),
        container="fracgpu-shim-run",
    )
    assert text.encode() == shim_abi.encode_limits(expected)


def launch_share(*flags: str) -> float:
    out = shim_run(
        "--fake-gpus",
        "1",
        "--memory",
        "1Gi",
        *flags,
        "--",
        str(BUILD / "tests" / "launch_ops"),
        "2000",
        "2",
        "launch",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return float(step(out.stdout, "launch")[3])


def test_cores_pace_a_busy_loop_to_the_slice(shim_build: Path) -> None:
    assert abs(launch_share("--cores", "30") - 0.30) <= TOLERANCE


def test_without_cores_the_gpu_is_not_paced(shim_build: Path) -> None:
    assert launch_share() >= 0.95


def test_the_system_driver_is_used_without_fake_gpus(shim_build: Path, tmp_path: Path) -> None:
    """No --fake-gpus: the command lists GPUs with the libcuda/libnvidia-ml the system resolves
    (here the double, put on the library path as a driver install would be)."""
    config = tmp_path / "gpus.conf"
    uuids = [f"GPU-5e5e0000-0000-4000-8000-00000000000{i}" for i in range(2)]
    config.write_text(
        f"state_file={tmp_path / 'state'}\ndevice_count=2\n"
        + "".join(
            f"device.{i}.uuid={u}\ndevice.{i}.memory_bytes={8 * GiB}\n" for i, u in enumerate(uuids)
        )
    )
    env = base_env(LD_LIBRARY_PATH=str(BUILD / "doubles"), FRACGPU_FAKE_GPU_CONFIG=str(config))
    seen = client("--memory", "1Gi", env=env)
    assert seen["cu_total"] == GiB
    assert seen["alloc_512mi_more"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert seen["visible"] == uuids[0]
    # The GPU's size comes from the driver: 8 GiB here, so 9 GiB cannot be a slice of it.
    too_big = shim_run("--memory", "9Gi", "--gpus", uuids[1], "--", "true", env=env)
    assert too_big.returncode == 1
    assert "more than GPU 1 has (8589934592 bytes" in too_big.stderr
    visible = shim_run("--memory", "1Gi", "--", "true", env={**env, "CUDA_VISIBLE_DEVICES": "1"})
    assert visible.returncode == 1
    assert "CUDA_VISIBLE_DEVICES is set" in visible.stderr


def test_without_a_driver_it_says_so(shim_build: Path) -> None:
    out = shim_run("--memory", "1Gi", "--", "true")
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "fracgpu-shim: error: no NVIDIA driver here: libcuda.so.1 is not on the library path; "
        "use --fake-gpus N to try a slice on the simulated GPU"
    ]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--memory", "1Gx"], "--memory '1Gx' is not a size"),
        (["--memory", "0"], "--memory '0' is not a whole number of bytes above 0"),
        (["--memory", "0.5"], "--memory '0.5' is not a whole number of bytes"),
        (["--memory=-1Gi"], "--memory '-1Gi' is not a whole number of bytes"),
        (["--memory", "99999Ei"], "--memory '99999Ei' is not a size"),
        (
            ["--memory", "1Gi", "--cores", "0"],
            "--cores '0' is not allowed: use a whole number 1..100",
        ),
        (["--memory", "1Gi", "--cores", "101"], "--cores '101' is not allowed"),
        (["--memory", "1Gi", "--cores", "3O"], "--cores '3O' is not allowed"),
        (
            ["--memory", "1Gi", "--fake-gpus", "17"],
            "--fake-gpus '17' is not allowed: use a whole number 0..16",
        ),
        (["--memory", "1Gi", "--fake-gpus", "-1"], "--fake-gpus '-1' is not allowed"),
        (["--memory", "1Gi", "--gpus", "first"], "'first' is neither a GPU index nor a UUID"),
        (["--memory", "1Gi", "--gpus", "GPU-1\nmode=whole"], "is neither a GPU index nor a UUID"),
        (["--memory", "1Gi", "--gpus", "0,0"], "--gpus '0,0' names a GPU twice"),
        (["--memory", "1Gi", "--gpus", ""], "--gpus '' names no GPU: use comma-separated"),
        (["--memory", "1Gi", "--gpus", " "], "--gpus ' ' names no GPU"),
        (["--memory", "1Gi", "--fake-gpu-memory", "1Gi"], "--fake-gpu-memory needs --fake-gpus N"),
        (
            ["--memory", "1Gi", "--fake-gpus", "1", "--fake-gpu-memory", "lots"],
            "--fake-gpu-memory 'lots' is not a size",
        ),
        (["--cores", "30"], "the following arguments are required: --memory"),
        (["--memory", "1Gi", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_flags_get_one_line_errors(flags: list[str], says: str) -> None:
    out = shim_run(*flags, "--", "true")
    assert out.returncode == 2
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("fracgpu-shim: error: ")
    assert says in out.stderr, out.stderr


@pytest.mark.parametrize(
    "args", [["run", "--version"], ["run", "--memory", "1Gi", "--version"], ["--version"]]
)
def test_version_is_printed_before_any_program(args: list[str]) -> None:
    out = subprocess.run(
        [*COMMAND[:-1], *args],
        env=base_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout == f"fracgpu-shim {__version__}\n"


def test_help_gives_the_range_the_flags_accept() -> None:
    out = shim_run("--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    # --fake-gpus 0 (the default) is the system's driver; _int_in accepts 0..16.
    assert "--fake-gpus N simulate N GPUs (0..16)" in text
    assert "0, the default, uses the system's driver" in text
    assert "--version" in text


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (512, "512 bytes"),
        (1536, "1.5 KiB"),
        (10**9, "953.7 MiB"),
        (GiB, "1 GiB"),
        (3 << 40, "3 TiB"),
    ],
)
def test_sizes_are_shown_readably(size: int, text: str) -> None:
    assert readable_size(size) == text


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "--memory", "1Gi", "true"], "put the program after `--`"),
        (["run", "--memory", "1Gi", "--"], "no program after `--`"),
        (["go", "--memory", "1Gi", "--", "true"], "the only command is `run`"),
    ],
)
def test_a_missing_program_or_command_gets_a_one_line_error(args: list[str], says: str) -> None:
    out = subprocess.run(
        [*COMMAND[:-1], *args],
        env=base_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (out.returncode, len(out.stderr.splitlines())) == (2, 1), out.stderr
    assert says in out.stderr


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--fake-gpus", "2", "--gpus", "2"], "there is no GPU 2; this machine has 0 (GPU-"),
        (
            ["--fake-gpus", "1", "--gpus", "0,GPU-fa4e0000-0000-4000-8000-000000000000"],
            "names one GPU twice",
        ),
        (["--fake-gpus", "1", "--fake-gpu-memory", "512Mi"], "more than GPU 0 has (536870912"),
        (
            ["--fake-gpus", "1", "--fake-gpu-memory", "1G"],
            "--memory 1073741824 bytes (1 GiB) is more than GPU 0 has "
            "(1000000000 bytes = 953.7 MiB)",
        ),
        (
            ["--fake-gpus", "1", "--shim-build", "/nonexistent"],
            "the shim library /nonexistent/libfracgpu-test.so is missing",
        ),
    ],
)
def test_a_slice_the_machine_cannot_give_is_refused(
    shim_build: Path, flags: list[str], says: str
) -> None:
    out = shim_run("--memory", "1Gi", *flags, "--", "true")
    assert (out.returncode, len(out.stderr.splitlines())) == (1, 1), out.stderr
    assert says in out.stderr


@pytest.mark.parametrize(
    ("program", "code"),
    [
        (["sh", "-c", "exit 37"], 37),
        (["true"], 0),
        (["sh", "-c", "kill -KILL $$"], 128 + signal.SIGKILL),
        (["no-such-program-fracgpu"], 127),
    ],
)
def test_the_exit_code_passes_through(shim_build: Path, program: list[str], code: int) -> None:
    out = shim_run("--fake-gpus", "1", "--memory", "1Gi", "--", *program)
    assert out.returncode == code, out.stderr


TRAPS = """
import os, signal, sys, time
def bye(sig, frame):
    print("got", signal.Signals(sig).name, flush=True)
    sys.exit(40 + sig)
signal.signal(signal.SIGTERM, bye)
signal.signal(signal.SIGUSR1, bye)
print("ready", os.environ["FRACGPU_TEST_LIMITS_PATH"], flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_signals_are_forwarded_and_files_removed(shim_build: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [*COMMAND, "--fake-gpus", "1", "--memory", "1Gi", "--", sys.executable, "-c", TRAPS],
        env=base_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline().split()
    assert ready[0] == "ready", proc.stderr.read() if proc.stderr else ""
    limits = Path(ready[1])
    assert limits.is_file()
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    # The program caught the signal itself and chose its exit code.
    assert out.split() == ["got", sig.name]
    assert proc.returncode == 40 + sig
    assert not limits.parent.exists()


def test_the_callers_environment_cannot_widen_the_slice(shim_build: Path, tmp_path: Path) -> None:
    """Attack: a caller's environment points the shim at a whole-GPU limits file of its own
    and asks for more memory; the program still gets only the slice it was run with."""
    whole = tmp_path / "whole"
    whole.write_bytes(shim_abi.encode_limits(shim_abi.Limits(whole=True)))
    env = base_env(
        FRACGPU_TEST_LIMITS_PATH=str(whole),
        FRACGPU_TEST_REGION_PATH=str(tmp_path / "region"),
        FRACGPU_MEMORY_LIMIT="8Gi",
    )
    seen = client("--fake-gpus", "1", "--memory", "1Gi", env=env)
    assert seen["cu_total"] == GiB
    assert seen["alloc_512mi_more"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert seen["limits_path"] != str(whole)


COUNTS_SIGINT = """
import os, signal, sys, time
if sys.argv[1] == "leave":  # out of the terminal's foreground group: only a sent copy reaches it
    os.setpgid(0, 0)
# Count deliveries where the C handler sees them (the wakeup fd gets a byte for each).
r, w = os.pipe()
os.set_blocking(w, False)
os.set_blocking(r, False)
signal.set_wakeup_fd(w, warn_on_full_buffer=False)
signal.signal(signal.SIGINT, lambda sig, frame: None)
print("ready", flush=True)
time.sleep(1.5)
try:
    got = os.read(r, 64)
except BlockingIOError:
    got = b""
sys.exit(len(got))
"""

# A session of its own with the pty as controlling terminal, then the command in it.
ON_A_TERMINAL = """
import fcntl, os, sys, termios
os.setsid()
fd = int(sys.argv[1])
fcntl.ioctl(fd, termios.TIOCSCTTY, 0)  # the new session's controlling terminal
for target in (0, 1, 2):
    os.dup2(fd, target)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


@pytest.mark.parametrize("group", ["stay", "leave"])
def test_ctrl_c_on_the_terminal_is_not_sent_twice(shim_build: Path, group: str) -> None:
    """Ctrl-C reaches the program through the terminal's foreground group (stay: at least
    once); the command does not send it on as well (leave: the program, out of that group,
    gets none, where a forwarded copy would be one)."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", ON_A_TERMINAL, str(slave), *COMMAND[1:],
         "--fake-gpus", "1", "--memory", "1Gi",
         "--", sys.executable, "-c", COUNTS_SIGINT, group],
        env=base_env(), cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        pass_fds=(slave,),
    )  # fmt: skip
    os.close(slave)
    try:
        seen = b""
        while b"ready" not in seen:
            seen += os.read(master, 1024)  # EIO if everything on the terminal has ended
        os.write(master, b"\x03")  # the terminal sends SIGINT to its foreground group
        code = proc.wait(timeout=30)
        assert code >= 1 if group == "stay" else code == 0, (group, code)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
