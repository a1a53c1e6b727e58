"""The kube-scheduler extender (protocol of Kubernetes 1.20, ``extenders:`` in a
KubeSchedulerConfiguration): ``filter``, ``prioritize`` and ``bind``.

These routes can bind any queued pod, so tenants must never reach them. They are served
over plain HTTP on 127.0.0.1 only (``loopback_app``): the fracgpu scheduler runs as a
sidecar in the webhook pod and is the only client. A replica that does not lead relays the
call to the leader's HTTPS port (``/extender/VERB``), where it is accepted only with an HMAC
of the body made with the key every replica derives from the serving key they share
(``Relay``): a tenant who reaches the Service has no such key. Bodies are bounded like
admission reviews'.
"""

import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiohttp import web

from webhook.queue.keys import SharedKey
from webhook.queue.scheduler import BindError, QueueScheduler
from webhook.serving.forward import ForwardError, LeaderForwarder
from webhook.state.backend import ForwardToLeader, StateBackend, StateUnavailable

log = logging.getLogger(__name__)
VERBS: Final = ("filter", "prioritize", "bind")
RELAY_PREFIX: Final = "/extender/"
MAC_HEADER: Final = "X-Fracgpu-Extender-Mac"
TIME_HEADER: Final = "X-Fracgpu-Extender-Time"
# A relayed call older (or newer) than this is refused: no replay later.
RELAY_WINDOW_S: Final = 30.0
MAX_EXTENDER_PRIORITY: Final = 10  # kube-scheduler's MaxExtenderPriority


class ExtenderRequestError(Exception):
    """A request body that is not what kube-scheduler sends; the message says what."""


@dataclass
class Extender:
    """Answers extender calls here when this replica leads, else relays them."""

    state: StateBackend
    scheduler: QueueScheduler
    relay_key: SharedKey
    forwarder: LeaderForwarder | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    clock: Callable[[], float] = time.time

    async def answer(self, verb: str, body: bytes, relayed: bool) -> Any:
        """The JSON answer to one call: an object, or for prioritize a list."""
        try:
            await self.state.check_placing()
        except ForwardToLeader as where:
            if relayed or not where.leader_url or self.forwarder is None:
                return _unavailable(verb, body, f"no leader can decide now ({where.reason})")
            try:
                answer = await self.forwarder.relay(
                    where.leader_url + RELAY_PREFIX + verb, body, self.sign(verb, body)
                )
                parsed: Any = orjson.loads(answer)
            except (ForwardError, orjson.JSONDecodeError) as error:
                return _unavailable(verb, body, f"the leader did not answer ({error})")
            return parsed
        except StateUnavailable as error:
            return _unavailable(verb, body, str(error))
        args = _json(body)
        if verb == "filter":
            return await self._filter(args)
        if verb == "prioritize":
            return await self._prioritize(args)
        return await self._bind(args)

    async def _filter(self, args: Mapping[str, Any]) -> Mapping[str, Any]:
        pod, candidates = _pod(args), _node_names(args)
        try:
            decision = await self.scheduler.decide(pod, candidates)
        except BindError as error:
            return {"nodenames": [], "failedNodes": dict.fromkeys(candidates, f"fracgpu: {error}")}
        if decision.placement is not None:
            chosen = decision.placement.node
            others = {n: f"fracgpu: placed on {chosen}" for n in candidates if n != chosen}
            return {"nodenames": [chosen], "failedNodes": others}
        return {"nodenames": [], "failedNodes": dict(decision.reasons)}

    async def _prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        pod, candidates = _pod(args), _node_names(args)
        try:
            decision = await self.scheduler.decide(pod, candidates)
        except BindError:
            return [{"host": n, "score": 0} for n in candidates]
        chosen = decision.placement.node if decision.placement is not None else ""
        return [
            {"host": n, "score": MAX_EXTENDER_PRIORITY if n == chosen else 0} for n in candidates
        ]

    async def _bind(self, args: Mapping[str, Any]) -> Mapping[str, Any]:
        try:
            namespace = _text(args, "podNamespace")
            name = _text(args, "podName")
            node = _text(args, "node")
            uid = str(_member(args, "podUID") or "")
        except ExtenderRequestError as error:
            return {"error": str(error)}
        try:
            await self.scheduler.bind(namespace, name, uid, node)
        except BindError as error:
            log.info("bind of %s/%s to %s refused: %s", namespace, name, node, error)
            return {"error": f"fracgpu: {error}"}
        return {}

    # -- relay between replicas ----------------------------------------------------------------
    def sign(self, verb: str, body: bytes) -> dict[str, str]:
        now = f"{self.clock():.3f}"
        return {TIME_HEADER: now, MAC_HEADER: self._mac(verb, now, body)}

    def relay_allowed(self, verb: str, headers: Mapping[str, str], body: bytes) -> bool:
        stamp, mac = headers.get(TIME_HEADER, ""), headers.get(MAC_HEADER, "")
        try:
            fresh = abs(self.clock() - float(stamp)) <= RELAY_WINDOW_S
        except ValueError:
            return False
        return (
            fresh
            and bool(mac)
            and any(
                hmac.compare_digest(mac, _mac(key, verb, stamp, body))
                for key in self.relay_key.accepted()
            )
        )

    def _mac(self, verb: str, stamp: str, body: bytes) -> str:
        return _mac(self.relay_key.current(), verb, stamp, body)


def _mac(key: bytes, verb: str, stamp: str, body: bytes) -> str:
    message = b"\0".join((verb.encode(), stamp.encode(), body))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def loopback_app(extender: Extender) -> web.Application:
    """The app the fracgpu scheduler calls: serve it on 127.0.0.1 only."""
    app = web.Application(client_max_size=extender.max_body_bytes)
    for verb in VERBS:
        app.router.add_post(f"/{verb}", _handler(extender, verb, relayed=False))
    return app


def add_relay_routes(app: web.Application, extender: Extender) -> None:
    """``/extender/VERB`` on the HTTPS server, for calls relayed by other replicas."""
    for verb in VERBS:
        app.router.add_post(RELAY_PREFIX + verb, _handler(extender, verb, relayed=True))


def _handler(
    extender: Extender, verb: str, relayed: bool
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body is over the limit of {extender.max_body_bytes} bytes")
        if relayed and not extender.relay_allowed(verb, request.headers, body):
            return _error(403, "relayed extender calls must be signed by a fracgpu replica")
        try:
            answer = await extender.answer(verb, body, relayed)
        except ExtenderRequestError as error:
            return _error(400, str(error))
        except Exception:
            log.exception("extender %s failed", verb)
            return _error(500, f"fracgpu extender {verb} failed; the error is in its log")
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    return handle


def _error(status: int, message: str) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps({"error": message}), content_type="application/json"
    )


def _unavailable(verb: str, body: bytes, why: str) -> Any:
    """No decision now: every node fails with a reason (the pod waits and is retried)."""
    message = f"fracgpu: {why}; the pod waits and is tried again"
    if verb == "bind":
        return {"error": message}
    try:
        candidates = _node_names(_json(body))
    except ExtenderRequestError:
        candidates = []
    if verb == "prioritize":
        return [{"host": n, "score": 0} for n in candidates]
    return {"nodenames": [], "failedNodes": dict.fromkeys(candidates, message)}


def _json(body: bytes) -> Mapping[str, Any]:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise ExtenderRequestError(f"body is not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise ExtenderRequestError("body must be a JSON object")
    return parsed


def _pod(args: Mapping[str, Any]) -> Mapping[str, Any]:
    pod = _member(args, "pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise ExtenderRequestError("ExtenderArgs.pod must be a pod object")
    return pod


def _node_names(args: Mapping[str, Any]) -> list[str]:
    """nodenames (nodeCacheCapable: true), else the names of nodes.items."""
    names = _member(args, "nodenames")
    if names is None:
        nodes = _member(args, "nodes") or {}
        items = nodes.get("items") if isinstance(nodes, dict) else None
        names = [
            (item.get("metadata") or {}).get("name")
            for item in items or ()
            if isinstance(item, dict)
        ]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ExtenderRequestError("ExtenderArgs.nodenames must be a list of node names")
    return names


def _member(args: Mapping[str, Any], key: str) -> Any:
    """A member by its protocol name; Go's JSON decoding ignores case, so do we."""
    if key in args:
        return args[key]
    lowered = key.lower()
    return next((v for k, v in args.items() if isinstance(k, str) and k.lower() == lowered), None)


def _text(args: Mapping[str, Any], key: str) -> str:
    value = _member(args, key)
    if not isinstance(value, str) or not value or len(value) > 253:
        raise ExtenderRequestError(f"ExtenderBindingArgs.{key} must be a name")
    return value
