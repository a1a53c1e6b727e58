"""``fracgpu-bench admission-stall``: can one tenant's huge pods stall everyone else's?

The webhook (``fracgpu serve``, embedded back end, NODES x GPUS) runs in its own process.
WORKERS clients post ordinary one-container GPU pods to /mutate back to back; in alternate
rounds, ATTACKERS more clients post pods as large as kube-apiserver stores (about 1.5 MB
each: tens of thousands of node-affinity expressions or terms, tolerations, containers, env
entries or volumes, and one of megabytes of args that is within every limit) back to back as
well. Printed: p50 / p99 of the ordinary pods without and with the large ones, their ratio
(target <= 2), and how long the large ones took to be answered. The rounds alternate because
this machine's speed drifts over tens of seconds: both cases see the same drift.
"""

import argparse
import asyncio
import io
import os
import ssl
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.admission.cli import _cluster_file, _free_port, _pod, _serve, _stop, _tls
from bench.admission.load import Result, merge

_GPU = {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "4"}
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _container(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "cuda:12", **extra}


def _shapes() -> dict[str, Callable[[int], dict[str, Any]]]:
    """Pods with ``n`` of one part each (``n`` of 1,000 is tens of kB)."""
    pad = "x" * 24

    def pod(**spec: Any) -> dict[str, Any]:
        base = _pod("large")
        base["spec"].update(spec)
        return base

    def required(terms: list[dict[str, Any]]) -> dict[str, Any]:
        return {"nodeAffinity": {_REQUIRED: {"nodeSelectorTerms": terms}}}

    def expression(i: int) -> dict[str, Any]:
        return {"key": f"k{i}-{pad}", "operator": "NotIn", "values": ["v"]}

    main = _container("main", resources={"limits": _GPU})
    return {
        "affinity expressions": lambda n: pod(
            affinity=required([{"matchExpressions": [expression(i) for i in range(n)]}])
        ),
        "affinity terms": lambda n: pod(
            affinity=required([{"matchExpressions": [expression(i)]} for i in range(n)])
        ),
        "tolerations": lambda n: pod(
            tolerations=[{"key": f"k{i}-{pad}", "operator": "Exists"} for i in range(n)]
        ),
        "containers": lambda n: pod(
            containers=[main, *(_container(f"c{i}-{pad}") for i in range(n))]
        ),
        "env": lambda n: pod(
            containers=[{**main, "env": [{"name": f"E{i}", "value": pad} for i in range(n)]}]
        ),
        "volumes": lambda n: pod(
            volumes=[{"name": f"v{i}-{pad}", "emptyDir": {}} for i in range(n)]
        ),
        "args (within every limit)": lambda n: pod(containers=[{**main, "args": [pad] * n}]),
    }


def _large_pods(size: int) -> dict[str, dict[str, Any]]:
    """Pods of about ``size`` bytes as JSON, one per shape."""
    pods = {}
    for name, make in _shapes().items():
        per_item = (len(orjson.dumps(make(2000))) - len(orjson.dumps(make(1000)))) / 1000
        pods[name] = make(max(int(size / per_item), 1))
    return pods


def _bodies(size: int) -> list[tuple[str, bytes]]:
    from webhook.cli.client import build_review  # noqa: PLC0415 - keeps --help fast

    return [
        (name, orjson.dumps(build_review(pod, uid=str(uuid.uuid4()), dry_run=True)))
        for name, pod in _large_pods(size).items()
    ]


async def _load(
    url: str,
    ca_file: Path,
    *,
    seconds: float,
    workers: int,
    attackers: int,
    large: list[tuple[str, bytes]],
) -> tuple[Result, Result | None]:
    """Ordinary pods from ``workers`` clients, large ones from ``attackers`` (0: none)."""
    from webhook.cli.client import build_review  # noqa: PLC0415

    context = ssl.create_default_context(cafile=str(ca_file))
    ordinary: list[float] = []
    attacks: list[float] = []
    errors = {"ordinary": 0, "large": 0}
    connector = aiohttp.TCPConnector(ssl=context, limit=workers + attackers)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = time.perf_counter() + seconds

        async def post(body: bytes, check: Callable[[dict[str, Any]], bool]) -> tuple[float, bool]:
            start = time.perf_counter()
            data = io.BytesIO(body) if len(body) > 2**20 else body
            async with session.post(url, data=data, headers=headers) as response:
                payload = await response.read()
            took = (time.perf_counter() - start) * 1000
            ok = response.status == 200 and check(orjson.loads(payload)["response"])
            return took, ok

        async def ordinary_worker() -> None:
            while time.perf_counter() < deadline:
                review = build_review(_pod("bench"), uid=str(uuid.uuid4()), dry_run=True)
                body = orjson.dumps(review)
                took, ok = await post(body, lambda r: bool(r["allowed"] and r.get("patch")))
                ordinary.append(took)
                errors["ordinary"] += not ok

        async def attacker(offset: int) -> None:
            turn = offset
            while time.perf_counter() < deadline:
                name, body = large[turn % len(large)]
                turn += 1
                within = name.startswith("args")
                took, ok = await post(
                    body,
                    lambda r, within=within: (  # type: ignore[misc]
                        bool(r["allowed"]) if within
                        else not r["allowed"] and "fracgpu's limit" in r["status"]["message"]
                    ),
                )  # fmt: skip
                attacks.append(took)
                errors["large"] += not ok

        started = time.perf_counter()
        await asyncio.gather(
            *(ordinary_worker() for _ in range(workers)), *(attacker(i) for i in range(attackers))
        )
        elapsed = time.perf_counter() - started
    first = Result(
        "ordinary pods" + (" while large pods arrive" if attackers else ", alone"),
        len(ordinary),
        elapsed,
        tuple(ordinary),
        errors["ordinary"],
    )
    if not attackers:
        return first, None
    return first, Result(
        f"large pods (~{len(large[0][1]) / 1e6:.1f} MB each)",
        len(attacks),
        elapsed,
        tuple(attacks),
        errors["large"],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fracgpu-bench admission-stall", description=__doc__)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0, help="per case, all rounds")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--workers", type=int, default=8, help="clients posting ordinary pods")
    parser.add_argument("--attackers", type=int, default=2, help="clients posting large pods")
    parser.add_argument(
        "--large-bytes", type=int, default=1_500_000, help="size of each large pod as JSON"
    )
    options = parser.parse_args(argv)
    if min(options.nodes, options.gpus, options.rounds, options.workers, options.attackers) < 1:
        parser.error("--nodes, --gpus, --rounds, --workers and --attackers: use 1 or more")
    if options.seconds <= 0 or options.large_bytes < 1000:
        parser.error("--seconds: above 0; --large-bytes: 1000 or more")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    large = _bodies(options.large_bytes)
    with tempfile.TemporaryDirectory(prefix="fracgpu-bench-") as tmp:
        work = Path(tmp)
        cert, key, ca_file = _tls(work)
        cluster = work / "cluster.yaml"
        _cluster_file(cluster, options.nodes, options.gpus)
        port = _free_port()
        fracgpu = Path(sys.executable).with_name("fracgpu")
        server = _serve(
            [str(fracgpu), "serve", "--cluster-file", str(cluster), "--host", "127.0.0.1",
             "--port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
             "--log-level", "WARNING"],
            port, ca_file,
        )  # fmt: skip
        url = f"https://127.0.0.1:{port}/mutate"
        seconds = options.seconds / options.rounds
        alone: list[Result] = []
        beside: list[Result] = []
        attacks: list[Result] = []
        try:
            # warm-up: the first large review starts the screening worker; the first pods
            # build the placement index
            asyncio.run(
                _load(url, ca_file, seconds=min(seconds, 2.0), workers=2, attackers=1, large=large)
            )
            for _ in range(options.rounds):
                alone.append(
                    asyncio.run(
                        _load(
                            url,
                            ca_file,
                            seconds=seconds,
                            workers=options.workers,
                            attackers=0,
                            large=large,
                        )
                    )[0]
                )
                ordinary, attack = asyncio.run(
                    _load(
                        url,
                        ca_file,
                        seconds=seconds,
                        workers=options.workers,
                        attackers=options.attackers,
                        large=large,
                    )
                )
                beside.append(ordinary)
                assert attack is not None
                attacks.append(attack)
        finally:
            _stop(server)
    results = [merge(alone), merge(beside), merge(attacks)]
    print(
        f"{options.nodes} nodes x {options.gpus} GPUs; {options.workers} clients of ordinary "
        f"pods, {options.attackers} of large pods ({', '.join(n for n, _ in large)}); "
        f"{options.rounds} alternating rounds of {seconds:.1f} s"
    )
    print("| case | requests | throughput | p50 ms | p99 ms | server CPU ms/request | errors |")
    print("|---|---|---|---|---|---|---|")
    for result in results:
        print(result.row())
    ratio = results[1].quantile(0.99) / results[0].quantile(0.99)
    print(
        f"\np99 of ordinary pods while large pods arrive / p99 without them = {ratio:.2f} "
        f"(target <= 2); large pods answered in {results[2].quantile(0.5):.0f} ms at p50, "
        f"{results[2].quantile(0.99):.0f} ms at p99, {max(results[2].latencies_ms):.0f} ms at most"
    )
    return 0 if all(r.errors == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
