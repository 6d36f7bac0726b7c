"""``metrics.listen``: a listener that serves ``GET /metrics`` only, without a token.

The admin API serves ``/metrics`` too, behind the admin token (Prometheus sends it with
``authorization: {credentials: ...}``). This listener is for scrapers that should not hold
the admin token: it exposes the counters and nothing else, and can be put on another
interface than the admin API.
"""

from __future__ import annotations

from aiohttp import web

from gateway.logs import error as errorlog
from gateway.metrics import MetricsHub
from gateway.metrics.config import CONTENT_TYPE

log = errorlog.log


async def metrics_response(hub: MetricsHub) -> web.Response:
    body = await hub.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def serve_metrics(listen: tuple[str, int], hub: MetricsHub) -> web.AppRunner | None:
    """Start the ``metrics.listen`` listener (None, logged, when it cannot bind)."""

    async def handler(request: web.Request) -> web.Response:
        return await metrics_response(hub)

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = listen
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except OSError as exc:
        await runner.cleanup()
        log.error("metrics listener not started: bind() to %s:%s failed (%s)", host, port, exc.strerror)
        return None
    log.log(errorlog.NOTICE, "metrics on %s:%s/metrics", host, port)
    return runner
