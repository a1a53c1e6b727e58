"""Closed-loop load: N workers post reviews back to back for a fixed time; latencies in ms."""

import asyncio
import os
import ssl
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True)
class Result:
    name: str
    requests: int
    seconds: float
    latencies_ms: tuple[float, ...]
    errors: int
    # CPU time the server process spent per request (from /proc), when measured
    server_cpu_ms: float | None = None

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def row(self) -> str:
        cpu = "" if self.server_cpu_ms is None else f"{self.server_cpu_ms:.2f}"
        return (
            f"| {self.name} | {self.requests} | {self.throughput:,.0f}/s | "
            f"{self.quantile(0.5):.2f} | {self.quantile(0.99):.2f} | {cpu} | {self.errors} |"
        )


async def post_load(
    name: str,
    url: str,
    ca_file: str,
    make_body: Callable[[int], dict[str, Any]],
    *,
    workers: int,
    seconds: float,
    check: Callable[[dict[str, Any]], bool],
) -> Result:
    context = ssl.create_default_context(cafile=ca_file)
    latencies: list[float] = []
    errors = 0
    counter = 0
    connector = aiohttp.TCPConnector(ssl=context, limit=workers)
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal errors, counter
            while time.perf_counter() < deadline:
                counter += 1
                body = make_body(counter)
                start = time.perf_counter()
                async with session.post(url, json=body) as response:
                    payload = await response.json()
                latencies.append((time.perf_counter() - start) * 1000)
                if response.status != 200 or not check(payload):
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
        elapsed = time.perf_counter() - started
    return Result(name, len(latencies), elapsed, tuple(latencies), errors)


def timed_calls(name: str, call: Callable[[int], None], count: int) -> Result:
    """Sequential calls (one at a time), for latency added to a single request."""
    latencies = []
    errors = 0
    started = time.perf_counter()
    for i in range(count):
        start = time.perf_counter()
        try:
            call(i)
        except Exception:
            errors += 1
        latencies.append((time.perf_counter() - start) * 1000)
    return Result(name, count, time.perf_counter() - started, tuple(latencies), errors)


def merge(rounds: list[Result]) -> Result:
    """Rounds of one case as one result: requests, time, latencies and errors summed, server
    CPU per request weighted by each round's requests."""
    requests = sum(r.requests for r in rounds)
    cpu = [r.server_cpu_ms * r.requests for r in rounds if r.server_cpu_ms is not None]
    return Result(
        rounds[0].name,
        requests,
        sum(r.seconds for r in rounds),
        tuple(latency for r in rounds for latency in r.latencies_ms),
        sum(r.errors for r in rounds),
        sum(cpu) / max(requests, 1) if len(cpu) == len(rounds) else None,
    )


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
