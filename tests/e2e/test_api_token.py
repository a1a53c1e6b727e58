"""The webhook's API client against the real apiserver with service-account tokens that stop
working: it re-reads its token file as the kubelet rotates it, re-reads it on a 401 and
retries once, and its watches resume from the last resourceVersion after a broken stream.

Tokens are real: minted by the apiserver's TokenRequest API for a ServiceAccount and bound
to a Secret, so deleting the Secret makes the token fail (401) at once, as a projected
token fails once it expires or its pod goes.
"""

import asyncio
import contextlib
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.cluster.apiclient import ApiError, KubeApi, endpoint_from_kubeconfig
from webhook.cluster.token import TokenFile
from webhook.cluster.watchcache import WatchCache, WatchSettings

from .harness.controlplane import ControlPlane

pytestmark = pytest.mark.e2e
AUDIENCE = "https://kubernetes.default.svc"
SA = "rotating"


async def _setup_reader(admin: KubeApi, namespace: str) -> None:
    """A ServiceAccount that may read and watch ConfigMaps in ``namespace``."""
    await admin.create(f"api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": SA}})
    await admin.create(
        f"apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        {
            "metadata": {"name": "read-configmaps"},
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}
            ],
        },
    )
    await admin.create(
        f"apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": "read-configmaps"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "read-configmaps"},
            "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": namespace}],
        },
    )  # fmt: skip


async def _mint(admin: KubeApi, namespace: str) -> tuple[str, str]:
    """(token, name of the Secret it is bound to): deleting the Secret revokes the token."""
    secret = await admin.create(
        f"api/v1/namespaces/{namespace}/secrets",
        {"metadata": {"name": f"bind-{uuid.uuid4().hex[:8]}"}},
    )
    name = secret["metadata"]["name"]
    answer = await admin.create(
        f"api/v1/namespaces/{namespace}/serviceaccounts/{SA}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [AUDIENCE],
                "expirationSeconds": 3600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": name,
                                   "uid": secret["metadata"]["uid"]},
            },
        },
    )  # fmt: skip
    return str(answer["status"]["token"]), name


def _status_with(control_plane: ControlPlane, token: str, path: str) -> int:
    context = ssl.create_default_context(cafile=str(control_plane.ca_cert))
    request = urllib.request.Request(
        control_plane.url + path, headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


async def _eventually(
    check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 15
) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.asynccontextmanager
async def _rotating(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> AsyncIterator[tuple[KubeApi, Path, Callable[[], Awaitable[None]]]]:
    """(admin client, kubeconfig whose user has a tokenFile, rotate()): rotate() revokes the
    token in the file, waits until the apiserver refuses it, and writes a fresh one, the way
    the kubelet swaps a projected token (a new file renamed over the old)."""
    admin = KubeApi(endpoint_from_kubeconfig(str(control_plane.kubeconfig("admin"))))
    async with admin:
        await _setup_reader(admin, namespace)
        token, bound = await _mint(admin, namespace)
        token_path = tmp_path / "token"
        token_path.write_text(token)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "e2e", "cluster": {
                        "server": control_plane.url,
                        "certificate-authority": str(control_plane.ca_cert)}}],
                    "users": [{"name": SA, "user": {"tokenFile": "token"}}],
                    "contexts": [{"name": SA, "context": {"cluster": "e2e", "user": SA}}],
                    "current-context": SA,
                }
            )
        )  # fmt: skip
        path = f"/api/v1/namespaces/{namespace}/configmaps"

        async def first_accepted() -> bool:
            return await asyncio.to_thread(_status_with, control_plane, token, path) == 200

        await _eventually(first_accepted, "the first token to be accepted")
        state = {"token": token, "bound": bound}

        async def rotate() -> None:
            old = state["token"]
            await admin.delete(f"api/v1/namespaces/{namespace}/secrets/{state['bound']}")

            async def refused() -> bool:
                return await asyncio.to_thread(_status_with, control_plane, old, path) == 401

            await _eventually(refused, "the revoked token to be refused")
            state["token"], state["bound"] = await _mint(admin, namespace)

            async def accepted() -> bool:
                token = state["token"]
                return await asyncio.to_thread(_status_with, control_plane, token, path) == 200

            # The apiserver checks a bound token's Secret in its informer cache: a token
            # minted a moment ago can be refused until the cache has its Secret. The kubelet
            # hands a pod tokens bound to the pod, long known by then.
            await _eventually(accepted, "the new token to be accepted")
            fresh = tmp_path / "token.new"
            fresh.write_text(state["token"])
            fresh.replace(token_path)

        yield admin, kubeconfig, rotate


async def test_calls_and_watches_keep_working_after_the_token_rotates(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    async with _rotating(control_plane, namespace, tmp_path) as (admin, kubeconfig, rotate):
        api = KubeApi(endpoint_from_kubeconfig(str(kubeconfig)))
        async with api:
            configmaps = f"api/v1/namespaces/{namespace}/configmaps"
            cache: WatchCache[Any] = WatchCache(
                api, configmaps, lambda o: o["metadata"]["name"],
                settings=WatchSettings(watch_timeout_s=1, backoff_initial_s=0.05,
                                       backoff_max_s=0.5),
            )  # fmt: skip
            task = asyncio.create_task(cache.run())
            try:
                await asyncio.wait_for(cache.synced.wait(), 10)
                await admin.create(configmaps, {"metadata": {"name": "before"}})

                async def seen(name: str) -> bool:
                    return cache.get(f"{namespace}/{name}") is not None

                await _eventually(lambda: seen("before"), "the watch to see 'before'")
                await rotate()
                assert (await api.list(configmaps))["kind"] == "ConfigMapList"
                # The watch reopens every second: with the old token it could never again.
                await admin.create(configmaps, {"metadata": {"name": "after"}})
                await _eventually(lambda: seen("after"), "the watch to see 'after'")
                await rotate()
                await admin.create(configmaps, {"metadata": {"name": "after-2"}})
                await _eventually(lambda: seen("after-2"), "the watch to see 'after-2'")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def test_a_401_rereads_the_token_file_and_retries_once(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    async with _rotating(control_plane, namespace, tmp_path) as (_, kubeconfig, rotate):
        endpoint = endpoint_from_kubeconfig(str(kubeconfig))
        assert endpoint.token_file == str(tmp_path / "token")
        # Never re-read on a timer or a file change: only a 401 can make it read again.
        tokens = TokenFile(endpoint.token_file, reread_s=1e9, check_s=1e9)
        async with KubeApi(endpoint, tokens=tokens) as api:
            configmaps = f"api/v1/namespaces/{namespace}/configmaps"
            await api.list(configmaps)
            await rotate()
            assert (await api.list(configmaps))["kind"] == "ConfigMapList"
            assert tokens.reads == 2  # the 401 made it read the new token
            # A token that is refused and not replaced: the 401 is the caller's, once.
            await rotate()
            (tmp_path / "token").write_text("not-a-valid-token")
            with pytest.raises(ApiError) as refused:
                await api.list(configmaps)
            assert refused.value.status == 401
