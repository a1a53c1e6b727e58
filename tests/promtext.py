"""Prometheus exposition text as tests read it: one value per series."""

import urllib.request


def samples(text: str) -> dict[str, float]:
    """Series (name with its labels, as exposed) -> value; comments and blank lines skipped."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            found[series] = float(value)
    return found


def scrape(port: int) -> dict[str, float]:
    """GET http://127.0.0.1:``port``/metrics, never through a proxy the environment names."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return samples(reply.read().decode())
