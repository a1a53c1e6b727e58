"""``fracgpu-bench kubectl-startup``: how long ``kubectl fracgpu`` takes before its first
request, next to what importing the ``kubernetes`` package alone costs (what the plugin
imported before it had its own small client) and a bare interpreter.

Each is a fresh process, run ROUNDS times interleaved; the medians and the ratio
plugin / kubernetes-import come from the same run. The plugin is asked for ``nodes`` with a
kubeconfig that does not exist, so it does all its start-up work and stops before the
network.
"""

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

_PROBES = {
    "bare interpreter": "pass",
    "import kubernetes (the old plugin's first step)": "import kubernetes.config",
    "kubectl fracgpu up to its first request": (
        "from webhook.kubectl import plugin as kubectl_plugin; "
        "kubectl_plugin.main(['--kubeconfig', '/nonexistent/kubeconfig', 'nodes'])"
    ),
}


def _once(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, timeout=120)
    return time.perf_counter() - started


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="fracgpu-bench kubectl-startup")
    parser.add_argument("--rounds", type=int, default=7, help="runs of each probe")
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {name: [] for name in _PROBES}
    for _ in range(max(args.rounds, 1)):
        for name, code in _PROBES.items():
            times[name].append(_once(code))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, value in medians.items():
        print(f"{name:<50} {value * 1000:7.0f} ms (median of {len(times[name])})")
    names = list(_PROBES)
    print(f"ratio plugin / kubernetes import: {medians[names[2]] / medians[names[1]]:.2f}")
    return 0
