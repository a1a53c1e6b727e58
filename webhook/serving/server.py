"""The aiohttp HTTPS app: /mutate, /validate, /healthz, /readyz, /metrics.

Every admission is answered at this edge: a malformed review gets a 4xx with a JSON Status
saying what is wrong; anything unexpected inside admission is logged and answered with
``allowed: false`` (fail closed), never with an HTTP 500.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiohttp import web

from webhook.admission import responses
from webhook.admission.decide import Admission
from webhook.admission.review import AdmissionRequest, MalformedReviewError, parse_review
from webhook.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from webhook.metrics import Metrics
from webhook.queue.extender import Extender, add_relay_routes
from webhook.queue.keys import SharedKey
from webhook.serving.forward import FORWARDED_BY_HEADER, ForwardError, LeaderForwarder
from webhook.serving.screen import Screened, Screener, ScreenUnavailableError
from webhook.serving.tls import CertificateReloader
from webhook.settings import PlacementMode, Settings
from webhook.state.backend import (
    ForwardToLeader,
    QuotaListing,
    SelfChecked,
    StateBackend,
    StateUnavailable,
)

log = logging.getLogger(__name__)

ADMISSION: Final = web.AppKey("admission", Admission)
STATE: Final = web.AppKey("state", StateBackend)
METRICS: Final = web.AppKey("metrics", Metrics)
SETTINGS: Final = web.AppKey("settings", Settings)
RELOADER: Final = web.AppKey("reloader", CertificateReloader)
FORWARDER: Final = web.AppKey("forwarder", LeaderForwarder)
SCREENER: Final = web.AppKey("screener", Screener)

Decide = Callable[[Admission, AdmissionRequest], Awaitable[responses.Verdict]]


def build_app(
    settings: Settings,
    state: StateBackend,
    metrics: Metrics,
    reloader: CertificateReloader | None = None,
    forwarder: LeaderForwarder | None = None,
    *,
    seal: SharedKey | None = None,
    extender: Extender | None = None,
) -> web.Application:
    # One byte over the cap still reaches parse_review, which names the limit in its answer.
    app = web.Application(client_max_size=settings.max_body_bytes + 1)
    app[SETTINGS] = settings
    app[STATE] = state
    app[METRICS] = metrics
    app[ADMISSION] = Admission(
        settings,
        state,
        metrics,
        seal=seal,
        held_nodes=extender.scheduler.held_nodes if extender is not None else None,
    )
    app[SCREENER] = Screener(settings.screen_workers, settings.pod_limits, settings.max_body_bytes)
    app.on_cleanup.append(_close_screener)
    metrics.watch_placing(state.placing)
    if isinstance(state, QuotaListing):
        metrics.watch_quotas(state.all_quotas)
    if isinstance(state, SelfChecked):
        metrics.watch_drift(state.drift_counts)
    app.router.add_post("/mutate", _admission_handler("mutate", Admission.mutate))
    app.router.add_post("/validate", _admission_handler("validate", Admission.validate))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    if reloader is not None:
        app[RELOADER] = reloader
        app.cleanup_ctx.append(_watch_certificates)
    if forwarder is not None:
        app[FORWARDER] = forwarder
        app.on_cleanup.append(_close_forwarder)
    if extender is not None:
        add_relay_routes(app, extender)
        metrics.watch_queue(extender.scheduler.waiting)
    return app


async def _close_screener(app: web.Application) -> None:
    await asyncio.get_running_loop().run_in_executor(None, app[SCREENER].close)


async def _close_forwarder(app: web.Application) -> None:
    await app[FORWARDER].close()


async def _watch_certificates(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[RELOADER].watch(), name="fracgpu-tls-reload")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _admission_handler(
    endpoint: str, decide: Decide
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        started = time.perf_counter()
        app = request.app
        metrics = app[METRICS]
        try:
            read = await _read(request)
            if isinstance(read, Screened):
                return await _screened(app, endpoint, started, read)
            body, depth_checked = read
            review = parse_review(
                body,
                request.headers.get("Content-Type", ""),
                app[SETTINGS].max_body_bytes,
                check_depth=not depth_checked,
            )
        except ScreenUnavailableError as error:
            log.error("%s: %s", endpoint, error)
            return _malformed(metrics, endpoint, started, MalformedReviewError(503, str(error)))
        except web.HTTPRequestEntityTooLarge:
            return _malformed(
                metrics,
                endpoint,
                started,
                MalformedReviewError(
                    413, f"body is over the limit of {app[SETTINGS].max_body_bytes} bytes"
                ),
            )
        except MalformedReviewError as error:
            return _malformed(metrics, endpoint, started, error)
        try:
            verdict = await decide(app[ADMISSION], review)
        except ForwardToLeader as where:
            forwarded = await _forward(request, body, review.uid, where)
            if isinstance(forwarded, bytes):
                metrics.admission(endpoint, "forwarded", time.perf_counter() - started)
                log.info("%s uid=%s forwarded to %s", endpoint, review.uid, where.leader_url)
                return web.Response(body=forwarded, content_type="application/json")
            verdict = forwarded
            if endpoint == "mutate" and app[SETTINGS].placement_mode is PlacementMode.QUEUE:
                # No leader to place it: queued, not refused (webhook.admission.decide._place).
                try:
                    verdict = await app[ADMISSION].mutate(review, leaderless=True)
                except Exception:
                    log.exception("uid=%s queueing without a leader failed", review.uid)
        except StateUnavailable as error:
            log.warning("uid=%s cluster state unavailable: %s", review.uid, error)
            verdict = responses.errored(f"fracgpu cannot read cluster state now: {error}", 503)
        except Exception:
            log.exception("uid=%s admission failed", review.uid)
            verdict = responses.errored(
                f"fracgpu webhook failed on request {review.uid}; the error is in its log"
            )
        return _answer(metrics, endpoint, started, review, verdict)

    return handle


async def _read(request: web.Request) -> tuple[bytes, bool] | Screened:
    """The body (and whether its depth was checked), or a worker's finding that answers it:
    a body larger than ``screen_body_bytes`` (or of unknown length) is read only when a
    screening slot is free, and screened off the loop (``webhook.serving.screen``)."""
    settings = request.app[SETTINGS]
    length = request.content_length
    if length is not None and length <= settings.screen_body_bytes:
        return await request.read(), False
    screener = request.app[SCREENER]
    async with screener.slots:
        body = await request.read()
        if len(body) <= settings.screen_body_bytes:
            return body, False
        screened = await screener.screen(body, request.headers.get("Content-Type", ""))
    if screened.malformed is not None:
        return screened
    if screened.request is not None and screened.request.username not in settings.service_accounts:
        return screened  # over a limit: fracgpu's own accounts are held to none (over_limit)
    return body, True


async def _screened(
    app: web.Application, endpoint: str, started: float, screened: Screened
) -> web.Response:
    """The answer to a large review from its screening alone: malformed, or a pod over a
    limit (denied where admission reads the pod)."""
    metrics = app[METRICS]
    if screened.malformed is not None:
        return _malformed(metrics, endpoint, started, screened.malformed)
    review = screened.request
    assert review is not None
    verdict = await app[ADMISSION].refuse(review, screened.problem)
    return _answer(metrics, endpoint, started, review, verdict, screened=True)


def _answer(
    metrics: Metrics,
    endpoint: str,
    started: float,
    review: AdmissionRequest,
    verdict: responses.Verdict,
    *,
    screened: bool = False,
) -> web.Response:
    """One place for how a decided review is counted, logged and answered: a review
    answered from its screening alone says so in its log line (and has no dryRun there)."""
    metrics.admission(endpoint, verdict.outcome.value, time.perf_counter() - started)
    log.info(
        "%s uid=%s %s %s/%s user=%s%s -> %s %s%s",
        endpoint,
        review.uid,
        review.operation,
        review.namespace,
        review.name,
        review.username,
        "" if screened else f" dryRun={review.dry_run}",
        verdict.outcome.value,
        verdict.message,
        " (screened)" if screened else "",
    )
    # orjson: the answer is encoded several times faster than by json_response's json.
    return web.Response(
        body=orjson.dumps(responses.to_review(review.uid, verdict)),
        content_type="application/json",
    )


async def _forward(
    request: web.Request, body: bytes, uid: str, where: ForwardToLeader
) -> bytes | responses.Verdict:
    """The leader's answer to this review, or a fail-closed verdict saying why there is none.
    A review that was itself forwarded is never forwarded again."""
    forwarder = request.app.get(FORWARDER)
    why = where.reason
    if forwarder is not None and where.leader_url and FORWARDED_BY_HEADER not in request.headers:
        try:
            return await forwarder.forward(where.leader_url + request.path, body, uid)
        except ForwardError as error:
            why = str(error)
    log.warning("uid=%s cannot place here: %s", uid, why)
    return responses.errored(
        f"fracgpu cannot place GPU pods right now ({why}): leadership is changing; "
        "create the pod again in a few seconds",
        503,
    )


def _malformed(
    metrics: Metrics, endpoint: str, started: float, error: MalformedReviewError
) -> web.Response:
    metrics.admission(endpoint, "malformed", time.perf_counter() - started)
    log.warning("%s: malformed review answered %d: %s", endpoint, error.status, error.message)
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": error.status,
        "message": error.message,
    }
    return web.json_response(body, status=error.status)


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.Response:
    if request.app[STATE].ready():
        return web.Response(text="ok")
    return web.Response(text="cluster state not synced yet", status=503)


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].exposition()
    response = web.Response(body=body)
    response.headers["Content-Type"] = METRICS_CONTENT_TYPE
    return response


@dataclass
class RunningServer:
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start(
    settings: Settings,
    state: StateBackend,
    reloader: CertificateReloader,
    forwarder: LeaderForwarder | None = None,
    *,
    seal: SharedKey | None = None,
    extender: Extender | None = None,
) -> RunningServer:
    """Serve HTTPS on settings.host:port (port 0 picks a free one) until ``stop``."""
    app = build_app(settings, state, Metrics(), reloader, forwarder, seal=seal, extender=extender)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, ssl_context=reloader.context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    host, port = runner.addresses[0][:2]
    return RunningServer(runner, str(host), int(port))
