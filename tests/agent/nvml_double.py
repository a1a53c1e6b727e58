"""The libnvidia-ml.so.1 test double (shim/testdoubles), loaded into this process.

pynvml opens "libnvidia-ml.so.1" by name; loading the double first by path makes the
dynamic loader hand back the already-loaded object with that soname, exactly as a real
driver library found on the library path would be. The double reads its configuration
file (FRACGPU_FAKE_GPU_CONFIG) again whenever it changes, and XID events are lines
appended to its events file.
"""

import ctypes
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIM_BUILD = REPO / "shim" / "build"
NVML_DOUBLE = SHIM_BUILD / "doubles" / "libnvidia-ml.so.1"
SHIM_LIBRARY = SHIM_BUILD / "libfracgpu.so"


# Everything the agent tests use from shim/build.
_NEEDED = (
    NVML_DOUBLE,
    SHIM_BUILD / "doubles" / "libcuda.so.1",
    SHIM_LIBRARY,
    SHIM_BUILD / "libfracgpu-test.so",
    SHIM_BUILD / "tests" / "mem_ops",
    SHIM_BUILD / "tests" / "limits_check",
)


def ensure_shim_built() -> None:
    """Build shim/ (libraries, doubles, test programs) when this checkout has not yet."""
    if all(path.is_file() for path in _NEEDED):
        return
    subprocess.run(["make", "-s", "-C", str(REPO / "shim")], check=True)


class NvmlDouble:
    def __init__(self, directory: Path) -> None:
        self.config = directory / "fake-gpus.conf"
        self.events = directory / "fake-gpus.events"
        self.events.write_text("")
        self._settings: dict[str, str] = {}

    def configure(self, **settings: str | int) -> None:
        """Replace the configuration (keys as in the double's README, dots as __)."""
        self._settings = {k.replace("__", "."): str(v) for k, v in settings.items()}
        self._write()

    def set(self, key: str, value: str | int | None) -> None:
        if value is None:
            self._settings.pop(key, None)
        else:
            self._settings[key] = str(value)
        self._write()

    def _write(self) -> None:
        lines = [f"events_file={self.events}"]
        lines += [f"{k}={v}" for k, v in self._settings.items()]
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, self.config)
        # The double notices changes by mtime; make each rewrite visibly newer.
        stamp = self.config.stat().st_mtime_ns + 1_000_000
        os.utime(self.config, ns=(stamp, stamp))

    def xid(self, gpu: str, xid: int) -> None:
        with self.events.open("a") as out:
            out.write(f"{gpu} {xid}\n")

    def env(self) -> dict[str, str]:
        return {
            "FRACGPU_FAKE_GPU_CONFIG": str(self.config),
            "LD_LIBRARY_PATH": str(NVML_DOUBLE.parent),
        }


_loaded: list[ctypes.CDLL] = []


def load_into_this_process() -> None:
    if not _loaded:
        _loaded.append(ctypes.CDLL(str(NVML_DOUBLE), mode=ctypes.RTLD_GLOBAL))


def double_in_this_process(
    directory: Path, monkeypatch: pytest.MonkeyPatch, **settings: str | int
) -> NvmlDouble:
    """The NVML double loaded into this test process, configured with ``settings`` and named
    by this process's environment (what the agent's own NVML calls then find)."""
    ensure_shim_built()
    load_into_this_process()
    fake = NvmlDouble(directory)
    fake.configure(**settings)
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    return fake
