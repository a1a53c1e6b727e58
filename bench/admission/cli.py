"""``fracgpu-bench admission``: the admission latency budget, measured in one run.

(a) an empty aiohttp handler over TLS, (b) the webhook's /mutate on the embedded back end with
NODES x GPUS GPUs, (c) pod creates through a real kube-apiserver without and with the
webhook registered (needs the e2e binaries: scripts/setup.sh --e2e; skip with --no-apiserver).
Servers run in their own processes; the load generator here is closed-loop.
"""

import argparse
import asyncio
import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import yaml

from bench.admission.load import (
    Result,
    median,
    merge,
    post_load,
    process_cpu_seconds,
    timed_calls,
)
from webhook.cli import selfsigned

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tls(directory: Path) -> tuple[Path, Path, Path]:
    """(certificate, key, CA) files of a throwaway CA for the servers on 127.0.0.1."""
    authority = selfsigned.new_authority()
    ca, cert, key = selfsigned.write_files(
        directory, authority, selfsigned.issue_serving(authority)
    )
    return cert, key, ca


def _cluster_file(path: Path, nodes: int, gpus: int) -> None:
    cluster = {
        "nodes": [
            {
                "name": f"gpu-{n:04d}",
                "cpu": "128",
                "memory": "1Ti",
                "gpus": [
                    {
                        "uuid": f"GPU-{n:04d}-{g:02d}",
                        "index": g,
                        "model": "NVIDIA A100-SXM4-80GB",
                        "memoryMiB": 81920,
                    }
                    for g in range(gpus)
                ],
            }
            for n in range(nodes)
        ]
    }
    path.write_text(yaml.safe_dump(cluster))


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "cuda:12",
                    "resources": {
                        "limits": {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "4"}
                    },
                }
            ]
        },
    }


def _review(i: int) -> dict[str, Any]:
    from webhook.cli.client import build_review  # noqa: PLC0415 - keeps --help fast

    return build_review(_pod(f"bench-{i}"), uid=str(uuid.uuid4()))


def _wait_ready(port: int, ca_file: Path, process: subprocess.Popen[bytes]) -> None:
    import ssl  # noqa: PLC0415

    context = ssl.create_default_context(cafile=str(ca_file))
    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}/readyz", context=context, timeout=2
            ) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server never became ready")


def _serve(args: list[str], port: int, ca_file: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_ready(port, ca_file, process)
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


def _with_server_cpu(server: subprocess.Popen[bytes], run: Callable[[], Result]) -> Result:
    """The load's result plus the server's own CPU time per request: unlike throughput, it
    does not depend on what else runs on the machine."""
    before = process_cpu_seconds(server.pid)
    result = run()
    used = process_cpu_seconds(server.pid) - before
    return dataclasses.replace(result, server_cpu_ms=1000 * used / max(result.requests, 1))


def _cpu_of(pid: int, run: Callable[[], Result]) -> tuple[Result, float]:
    """The result of ``run`` and the CPU seconds process ``pid`` used meanwhile."""
    before = process_cpu_seconds(pid)
    result = run()
    return result, process_cpu_seconds(pid) - before


def _measure_servers(
    work: Path, tls: tuple[Path, Path, Path], options: argparse.Namespace
) -> tuple[list[Result], list[float]]:
    """(a) and (b), measured in alternating rounds with both servers up: this machine's speed
    drifts by tens of percent over tens of seconds, and two back-to-back blocks of load would
    compare two different machines. Returns each server's rounds merged, and the throughput
    ratio (b) / (a) of each round pair."""
    cert, key, ca_file = tls
    cluster = work / "cluster.yaml"
    _cluster_file(cluster, options.nodes, options.gpus)
    empty_port, mutate_port = _free_port(), _free_port()
    fracgpu = Path(sys.executable).with_name("fracgpu")
    empty = _serve(
        [sys.executable, "-m", "bench.admission.empty_server", "--port", str(empty_port),
         "--cert", str(cert), "--key", str(key)],
        empty_port, ca_file,
    )  # fmt: skip
    try:
        mutate = _serve(
            [str(fracgpu), "serve", "--cluster-file", str(cluster), "--host", "127.0.0.1",
             "--port", str(mutate_port), "--tls-cert-file", str(cert), "--tls-key-file",
             str(key), "--log-level", "WARNING"],
            mutate_port, ca_file,
        )  # fmt: skip
    except BaseException:
        _stop(empty)
        raise
    seconds = options.seconds / options.rounds
    empty_rounds: list[Result] = []
    mutate_rounds: list[Result] = []
    try:
        for _ in range(options.rounds):
            empty_rounds.append(_with_server_cpu(empty, lambda: asyncio.run(post_load(
                "(a) empty aiohttp handler, TLS", f"https://127.0.0.1:{empty_port}/mutate",
                str(ca_file), _review, workers=options.workers, seconds=seconds,
                check=lambda r: bool(r["response"]["allowed"]),
            ))))  # fmt: skip
            mutate_rounds.append(_with_server_cpu(mutate, lambda: asyncio.run(post_load(
                f"(b) /mutate, embedded, {options.nodes} nodes x {options.gpus} GPUs",
                f"https://127.0.0.1:{mutate_port}/mutate", str(ca_file), _review,
                workers=options.workers, seconds=seconds,
                check=lambda r: bool(r["response"]["allowed"] and r["response"].get("patch")),
            ))))  # fmt: skip
    finally:
        _stop(mutate)
        _stop(empty)
    ratios = [m.throughput / e.throughput for e, m in zip(empty_rounds, mutate_rounds, strict=True)]
    return [merge(empty_rounds), merge(mutate_rounds)], ratios


def _measure_apiserver(work: Path, options: argparse.Namespace) -> list[Result]:
    sys.path.insert(0, str(ROOT))  # the e2e harness lives in the checkout's tests/
    import kubernetes.client  # noqa: PLC0415

    try:
        from tests.e2e.harness import (  # noqa: PLC0415
            ControlPlane,
            E2EConfig,
            apply_crds,
            create_gpunode,
            create_node,
            fake_devices,
            gpu_allocatable,
            require_binaries,
        )
        from tests.e2e.harness.kube import body  # noqa: PLC0415
        from tests.e2e.webhook_harness import (  # noqa: PLC0415
            FRACGPU_NAMESPACE,
            WebhookReplica,
            WebhookTLS,
            register_webhooks,
            wait_placing,
        )
    except ModuleNotFoundError as error:
        if not (error.name or "").startswith("tests"):
            raise
        raise SystemExit(
            "fracgpu-bench admission: the API-server rounds use the e2e harness in the "
            "repository's tests/: run it from a checkout"
        ) from None

    config = E2EConfig.from_env()
    with ControlPlane(require_binaries(config), config) as plane:
        client = plane.api_client("admin", pool_size=32)
        apply_crds(client)
        core = kubernetes.client.CoreV1Api(client)
        core.create_namespace(body({"metadata": {"name": "bench"}}))
        # The replica's Lease lives here: without it no replica leads, and the controllers
        # (reservation pruning, summaries) that run in production would not run in the bench.
        core.create_namespace(
            body({"metadata": {"name": FRACGPU_NAMESPACE, "labels": {"fracgpu.io/ignore": "true"}}})
        )

        def node(n: int) -> None:
            name = f"gpu-{n:04d}"
            create_node(client, name, extended=gpu_allocatable(options.gpus, 81920))
            create_gpunode(client, name, fake_devices(name, options.gpus, memory_mib=81920))

        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(node, range(options.nodes)))

        def create(prefix: str) -> Any:
            return lambda i: core.create_namespaced_pod("bench", body(_pod(f"{prefix}-{i}")))

        apiserver = plane.apiserver.process.pid
        assert apiserver is not None
        timed_calls("warm-up", create("warm-plain"), options.warmup)
        plain, plain_cpu = _cpu_of(
            apiserver,
            lambda: timed_calls("(c) pod create, no webhook", create("plain"), options.creates),
        )
        results = [plain]
        tls_dir = work / "webhook-tls"
        webhook_tls = WebhookTLS.create(tls_dir)
        replica = WebhookReplica(
            "bench", plane.kubeconfig("admin"), webhook_tls, work, ["--log-level", "WARNING"]
        ).start()
        try:
            replica.wait_ready(120)
            wait_placing([replica])
            register_webhooks(client, f"https://127.0.0.1:{replica.port}", webhook_tls.ca_pem)
            _wait_first_summaries(client, options.nodes)
            time.sleep(1.0)
            # The first GPU pod after a replica starts to lead builds the placement index for
            # the workload it sees (tens of ms, once): reported here, not in the p99 below.
            warm = timed_calls("warm-up", create("warm-gpu"), options.warmup)
            print(
                f"warm-up: {options.warmup} pod creates with the webhook, the first "
                f"{warm.latencies_ms[0]:.1f} ms, the rest at most "
                f"{max(warm.latencies_ms[1:], default=0.0):.1f} ms"
            )
            assert replica.process is not None
            webhook_pid = replica.process.pid
            before = process_cpu_seconds(webhook_pid)
            hooked, hooked_cpu = _cpu_of(
                apiserver,
                lambda: timed_calls("(c) pod create, with webhook", create("gpu"), options.creates),
            )
            webhook_ms = 1000 * (process_cpu_seconds(webhook_pid) - before) / options.creates
            results.append(dataclasses.replace(hooked, server_cpu_ms=webhook_ms))
            print(
                f"kube-apiserver CPU per pod create: {plain_cpu / options.creates * 1000:.2f} ms "
                f"without the webhook, {hooked_cpu / options.creates * 1000:.2f} ms with it "
                "(the server CPU column of the row with the webhook is the webhook's)"
            )
        finally:
            replica.stop()
    return results


def _wait_first_summaries(client: Any, nodes: int, timeout_s: float = 300) -> None:
    """Wait for the new leader's first controller round (a summary on every GPUNode, one
    write each): a one-off burst at start-up, not part of admitting a pod."""
    import kubernetes.client  # noqa: PLC0415

    custom = kubernetes.client.CustomObjectsApi(client)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = cast(
            dict[str, Any], custom.list_cluster_custom_object("fracgpu.io", "v1alpha1", "gpunodes")
        )
        done = len([i for i in listed["items"] if (i.get("status") or {}).get("summary")])
        if done >= nodes:
            return
        time.sleep(1.0)
    raise RuntimeError(f"the webhook's controllers did not summarise {nodes} GPUNodes in time")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fracgpu-bench admission", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="per server, all rounds together"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="alternating (a)/(b) rounds the seconds split into"
    )
    parser.add_argument("--workers", type=int, default=16, help="concurrent requests")
    parser.add_argument("--creates", type=int, default=300, help="pod creates per case")
    parser.add_argument(
        "--warmup", type=int, default=10, help="untimed pod creates before each case's timed ones"
    )
    parser.add_argument("--no-apiserver", action="store_true", help="skip part (c)")
    options = parser.parse_args(argv)
    if options.rounds < 1 or options.seconds <= 0:
        parser.error(
            f"--rounds {options.rounds} --seconds {options.seconds}: use 1 or more "
            "rounds and more than 0 seconds"
        )
    if options.creates < 1 or options.warmup < 1:
        parser.error(
            f"--creates {options.creates} --warmup {options.warmup}: use 1 or more of each"
        )
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory(prefix="fracgpu-bench-") as tmp:
        work = Path(tmp)
        tls = _tls(work)
        results, ratios = _measure_servers(work, tls, options)
        if not options.no_apiserver:
            results += _measure_apiserver(work, options)
    print("| case | requests | throughput | p50 ms | p99 ms | server CPU ms/request | errors |")
    print("|---|---|---|---|---|---|---|")
    for result in results:
        print(result.row())
    empty, mutate = results[0], results[1]
    print(
        f"\n/mutate throughput / empty handler throughput = "
        f"{mutate.throughput / empty.throughput:.2f} over all rounds, median of the "
        f"{len(ratios)} round pairs {median(ratios):.2f} "
        f"(each: {', '.join(f'{r:.2f}' for r in ratios)}; target >= 0.5)"
    )
    if mutate.server_cpu_ms and empty.server_cpu_ms:
        print(
            f"server CPU per request: /mutate {mutate.server_cpu_ms:.2f} ms, empty handler "
            f"{empty.server_cpu_ms:.2f} ms (ratio {empty.server_cpu_ms / mutate.server_cpu_ms:.2f})"
        )
    if len(results) == 4:
        added = results[3].quantile(0.99) - results[2].quantile(0.99)
        print(
            f"webhook adds {added:.1f} ms to a pod create at p99 "
            f"({results[3].quantile(0.5) - results[2].quantile(0.5):.1f} ms at p50; "
            "target < 15 ms at p99)"
        )
    return 0 if all(r.errors == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
