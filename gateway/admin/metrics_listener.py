"""``metrics.listen``: a listener that serves ``GET /metrics`` only, without a token.

The admin API serves ``/metrics`` too, behind the admin token (Prometheus sends it with
``authorization: {credentials_file: ...}``). This listener is for scrapers that should not hold
the admin token, a remote Prometheus above all: it exposes the counters and nothing else, and
can be put on another interface than the admin API.

It holds no secret, but its counters name routes and upstream addresses, so a web page must
not read them: like the admin API it refuses, before answering, a request with a foreign
``Origin``, one a browser marks cross-site, and, on a loopback listener, a ``Host`` that is
not a loopback name (DNS rebinding): ``guard.refusal``. Prometheus sends no ``Origin`` and
no ``Sec-Fetch-*`` header, and names the target it was given in ``Host``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.admin import guard
from gateway.admin.replies import json_reply
from gateway.config.validate import is_loopback_host
from gateway.logs import error as errorlog
from gateway.metrics import MetricsHub
from gateway.metrics.config import CONTENT_TYPE

log = errorlog.log


def metrics_app(render: Callable[[], Awaitable[bytes]], *, loopback: bool) -> web.Application:
    """The listener's application: ``GET /metrics`` behind the browser checks."""

    @web.middleware
    async def checks(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        refused = guard.refusal(request, loopback_listener=loopback)
        if refused is not None:
            return json_reply({"error": refused[1]}, refused[0])
        return await handler(request)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=await render(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application(middlewares=[checks])
    app.router.add_get("/metrics", metrics)
    return app


async def serve_metrics(listen: tuple[str, int], hub: MetricsHub) -> web.AppRunner | None:
    """Start the ``metrics.listen`` listener (None, logged, when it cannot bind)."""
    host, port = listen
    runner = web.AppRunner(metrics_app(hub.render, loopback=is_loopback_host(host)), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except OSError as exc:
        await runner.cleanup()
        log.error("metrics listener not started: bind() to %s:%s failed (%s)", host, port, exc.strerror)
        return None
    log.log(errorlog.NOTICE, "metrics on %s:%s/metrics", host, port)
    return runner
