"""A watch that breaks resumes from the last resourceVersion it saw, without listing again.

A real apiserver behind a loopback TCP proxy the test can cut, as a load balancer or a
network blip cuts a long watch.
"""

import asyncio
import dataclasses
import urllib.parse
from pathlib import Path

import pytest

from webhook.cluster.apiclient import KubeApi, endpoint_from_kubeconfig
from webhook.cluster.watchcache import WatchCache, WatchSettings

from .harness.controlplane import ControlPlane

pytestmark = pytest.mark.e2e


class CuttableProxy:
    """Forwards loopback TCP connections to the apiserver; ``cut`` drops all of them."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.port = 0
        self.connections = 0

    async def __aenter__(self) -> "CuttableProxy":
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> None:
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        server_r, server_w = await asyncio.open_connection(*self._target)
        self._writers += [client_w, server_w]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while chunk := await source.read(65536):
                    sink.write(chunk)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.transport.abort()

        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))


async def test_a_broken_watch_resumes_from_its_last_version(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    endpoint = endpoint_from_kubeconfig(str(control_plane.kubeconfig("admin")))
    url = urllib.parse.urlsplit(endpoint.server)
    assert url.hostname is not None and url.port is not None
    async with CuttableProxy(url.hostname, url.port) as proxy:
        proxied = dataclasses.replace(endpoint, server=f"https://{url.hostname}:{proxy.port}")
        async with KubeApi(endpoint) as admin, KubeApi(proxied) as api:
            configmaps = f"api/v1/namespaces/{namespace}/configmaps"
            cache: WatchCache[str] = WatchCache(
                api, configmaps, lambda o: str(o["metadata"]["name"]),
                settings=WatchSettings(watch_timeout_s=120, backoff_initial_s=0.05),
            )  # fmt: skip
            task = asyncio.create_task(cache.run())
            try:
                await asyncio.wait_for(cache.synced.wait(), 10)
                for name in ("a", "b"):
                    await admin.create(configmaps, {"metadata": {"name": name}})
                    for _ in range(100):
                        if cache.get(f"{namespace}/{name}"):
                            break
                        await asyncio.sleep(0.1)
                    assert cache.get(f"{namespace}/{name}") == name
                    proxy.cut()  # mid-watch; "b" is created while the watch is down
                for _ in range(100):
                    if cache.resumes >= 2 and cache.get(f"{namespace}/b"):
                        break
                    await asyncio.sleep(0.1)
                assert cache.get(f"{namespace}/b") == "b"
                assert cache.resumes >= 2
                assert cache.relists == 1  # resumed each time, never listed again
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
