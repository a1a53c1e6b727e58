"""A CUDA-stack client written by others, in a container of the tier: NVIDIA's pynvml
(nvidia-ml-py, what monitoring agents and `nvidia-smi`-like tools use) sees the slice.

The image holds no Python: the Python that runs the tests and its site-packages are mounted
read-only into the pod from the host (hostPath volumes of the test pod, not something
fracgpu injects); the driver arrives through the container toolkit as for any GPU pod."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from fracgpu import names

from .pods import GIB, pod_body, run_probe, sections
from .tier.tier import GPU_UUID, PYTHON_PREFIX, PYTHON_SITE, NodeTier

PYNVML = """
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
m = n.nvmlDeviceGetMemoryInfo(h)
uuid = n.nvmlDeviceGetUUID(h)
print(n.nvmlDeviceGetCount(), uuid.decode() if isinstance(uuid, bytes) else uuid, m.total, m.used)
"""


# Where the host's Python prefix is mounted: a path of its own, so a system Python (/usr)
# does not shadow the image's /usr, where the container toolkit puts the driver.
MOUNTED_PREFIX = Path("/opt/host-python")


def client_pod(name: str, limits: dict[str, str], code: str) -> dict[str, Any]:
    binary = Path(os.path.realpath(sys.executable))
    if not binary.is_relative_to(PYTHON_PREFIX):
        pytest.skip(f"the test's Python {binary} is not under its prefix {PYTHON_PREFIX}")
    python = MOUNTED_PREFIX / binary.relative_to(PYTHON_PREFIX)
    script = (
        f'{{ echo "== client"; {python} -c "$CLIENT_CODE"; echo "exit=$?"; }}'
        " > /dev/termination-log 2>&1"
    )
    body = pod_body(name, limits=limits, command=script)
    container = body["spec"]["containers"][0]
    container["env"] = [
        {"name": "CLIENT_CODE", "value": code},
        {"name": "PYTHONHOME", "value": str(MOUNTED_PREFIX)},
        {"name": "PYTHONPATH", "value": "/site"},
        # a Python built with a shared libpython finds it by an absolute RUNPATH
        {"name": "LD_LIBRARY_PATH", "value": str(MOUNTED_PREFIX / "lib")},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    container["volumeMounts"] = [
        {"name": "python", "mountPath": str(MOUNTED_PREFIX), "readOnly": True},
        {"name": "site", "mountPath": "/site", "readOnly": True},
    ]
    body["spec"]["volumes"] = [
        {"name": "python", "hostPath": {"path": str(PYTHON_PREFIX), "type": "Directory"}},
        {"name": "site", "hostPath": {"path": str(PYTHON_SITE), "type": "Directory"}},
    ]
    return body


def test_pynvml_in_a_container_sees_the_slice(node_tier: NodeTier, namespace: str) -> None:
    limits = {names.RESOURCE_VCUDA_CORE: "25", names.RESOURCE_VCUDA_MEMORY: "12"}  # 3 GiB
    report = run_probe(node_tier, namespace, client_pod("pynvml", limits, PYNVML))
    lines = sections(report)["client"]
    assert lines[-1] == "exit=0", report
    count, uuid, total, used = lines[0].split()
    assert (count, uuid, int(total), int(used)) == ("1", GPU_UUID, 3 * GIB, 0), report
