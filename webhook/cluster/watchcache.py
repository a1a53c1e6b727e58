"""A list+watch cache of one resource, kept small by storing only a transform of each object.

List, then watch from the list's resourceVersion, with bookmarks (the server moves the
version on even when nothing in the selection changes); a watch that ends or breaks resumes
from the last version seen, a 410 Gone or a periodic resync lists again (diffed against the
cache so listeners see only real changes). Errors back off exponentially; a watch that keeps
breaking (``max_resumes`` times in a row) is listed again. ``synced`` is set after the
first successful list.
"""

import asyncio
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import aiohttp

from webhook.cluster.apiclient import ApiError, GoneError, KubeApi, Obj

T = TypeVar("T")
Listener = Callable[[str, "T | None", "T | None"], None]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchSettings:
    resync_s: float = 300.0
    watch_timeout_s: int = 240
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 30.0
    max_resumes: int = 5


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


class WatchCache(Generic[T]):
    """Objects at ``path`` (optionally label-selected), transformed; listeners see changes."""

    def __init__(
        self,
        api: KubeApi,
        path: str,
        transform: Callable[[Obj], T | None],
        *,
        label_selector: str | None = None,
        settings: WatchSettings = WatchSettings(),
        name: str = "",
    ) -> None:
        self._api = api
        self._path = path
        self._transform = transform
        self._selector = label_selector
        self._settings = settings
        self._name = name or path
        self._items: dict[str, T] = {}
        # resourceVersion of each cached object: an event for the version already held (our
        # own write, applied by ``put``) is not transformed again.
        self._versions: dict[str, str] = {}
        self._listeners: list[Listener[T]] = []
        self.synced = asyncio.Event()
        self.relists = 0
        self.resumes = 0  # watches resumed from the last version after a broken stream

    def add_listener(self, listener: "Listener[T]") -> None:
        self._listeners.append(listener)

    def put(self, obj: Obj) -> None:
        """Apply an object this process just wrote, without waiting for its watch event.

        An older version arriving later from the watch is harmless: every write that
        depends on the cache is guarded by resourceVersion, so staleness costs a retry.
        """
        self._store(object_key(obj), obj)

    def put_record(self, key: str, version: str, value: T) -> None:
        """Like ``put``, for a write whose resulting record the caller already knows (a
        resourceVersion-guarded patch of a known version): no decoding of the answer."""
        self._set(key, value)
        self._versions[key] = version

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._items.items()))

    def __len__(self) -> int:
        return len(self._items)

    async def run(self) -> None:
        """Keep the cache current until cancelled."""
        backoff = self._settings.backoff_initial_s
        while True:
            try:
                version = await self._relist()
                backoff = self._settings.backoff_initial_s
                await self._watch_until_resync(version)
            except asyncio.CancelledError:
                raise
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError, KeyError) as error:
                log.warning("watch %s failed (%s); retrying in %.1fs", self._name, error, backoff)
                await asyncio.sleep(backoff * (0.5 + random.random()))  # jitter
                backoff = min(backoff * 2, self._settings.backoff_max_s)

    async def _relist(self) -> str:
        params: dict[str, str | int] = {}
        if self._selector:
            params["labelSelector"] = self._selector
        listed = await self._api.list(self._path, **params)
        objects = {object_key(obj): obj for obj in listed.get("items", [])}
        for key in list(self._items):
            if key not in objects:
                self._set(key, None)
        for key, obj in objects.items():
            self._store(key, obj)
        self.relists += 1
        self.synced.set()
        return str(listed.get("metadata", {}).get("resourceVersion", ""))

    async def _watch_until_resync(self, version: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.resync_s
        params: dict[str, str | int] = {}
        if self._selector:
            params["labelSelector"] = self._selector
        broken = 0
        while loop.time() < deadline:
            remaining = max(1, min(self._settings.watch_timeout_s, int(deadline - loop.time())))
            try:
                async for event in self._api.watch(self._path, version, remaining, **params):
                    version = self._apply(event, version)
                    broken = 0
            except GoneError:
                return
            except (aiohttp.ClientError, TimeoutError) as error:
                broken += 1
                if broken > self._settings.max_resumes:
                    raise
                delay = min(
                    self._settings.backoff_initial_s * 2 ** (broken - 1),
                    self._settings.backoff_max_s,
                )
                log.info(
                    "watch %s broke (%s); resuming from resourceVersion %s in %.1fs",
                    self._name, error, version, delay,
                )  # fmt: skip
                await asyncio.sleep(delay * (0.5 + random.random()))
                self.resumes += 1

    def _apply(self, event: Obj, version: str) -> str:
        kind = event.get("type")
        obj = event.get("object", {})
        new_version = str(obj.get("metadata", {}).get("resourceVersion", version))
        if kind == "BOOKMARK":
            return new_version
        key = object_key(obj)
        if kind == "DELETED":
            self._set(key, None)
        else:
            self._store(key, obj)
        return new_version

    def _store(self, key: str, obj: Obj) -> None:
        version = str(obj.get("metadata", {}).get("resourceVersion", ""))
        if version and key in self._items and self._versions.get(key) == version:
            return  # the same object version: nothing changed
        value = self._transform(obj)
        self._set(key, value)
        if value is not None and version:
            self._versions[key] = version
        else:
            self._versions.pop(key, None)

    def _set(self, key: str, value: T | None) -> None:
        old = self._items.get(key)
        if value is None:
            self._versions.pop(key, None)
            if key not in self._items:
                return
            del self._items[key]
        else:
            if old == value:
                return
            self._items[key] = value
        for listener in self._listeners:
            listener(key, old, value)
