"""The admin API, on ``admin.listen`` (default 127.0.0.1:9180), for operators and the CLI.

    GET    /healthz           "ok"                                    (no token needed)
    GET    /readyz            {"ready": true} or 503 {"ready": false, "reason": ...}  (no token needed); with
                              Redis, "redis": "up"|"down" and "on_error": 503 only while draining or with
                              Redis down under on_error: deny (the node refuses requests then)
    GET    /                  the status page (HTML without data; its script asks for the token)
    GET    /status/page.js, /status/page.css, /favicon.ico   the page's own files (no token needed)
    GET    /status            JSON: version, pid, store, Redis circuit, zones, bans
    GET    /status/activity   JSON for the status page: per-zone passed/delayed/rejected per 10 s
                              bucket, per-route requests, app 5xx and upstream time per bucket,
                              the most rejected keys, upstream health, the Redis circuit,
                              the config hash and reload time (gateway/metrics/activity.py)
    GET    /bans              JSON list of bans in force, sorted by target; X-Total-Count: how many
                              match. ?match=10.0.0.0/8 &reason=feed &limit=100 &offset=0
                              (limit defaults to 1000, at most 100000)
    POST   /bans              {"target": "203.0.113.7" | "10.0.0.0/8", "for": "1h" | 0, "reason": "...",
                               "force": false}
                              or many: {"bans": ["192.0.2.1", {"target": ..., "for": ..., "reason": ...}],
                               "for": ..., "reason": ..., "force": false} (the defaults for every entry;
                               force applies to all) -> {"banned": N, "refused": [...], "invalid": [...]}
    DELETE /bans/{target}     target URL-encoded (10.0.0.0%2F8)
    POST   /bans/remove       {"targets": [...]} -> {"removed": N, "not_banned": [...], "invalid": [...]}
    GET    /zones/{zone}/{key}  JSON: one key's state (excess, remaining, banned_for_ms, ... by zone type);
                              the key as text (a client IP for $binary_remote_addr), URL-encoded; 404
                              for an unknown zone or a key with no state
    DELETE /zones/{zone}/{key}  reset that key's state (404 when it had none)
    GET    /config            JSON: the configuration in force, secrets redacted (gateway/admin/config_view.py)
    POST   /reload            like SIGHUP -> {"reloaded": bool, "errors": [...], "notes": [...]}: errors
                              (bad config, a new listen address that cannot be bound) keep the running
                              configuration; notes say what needs a restart
    GET    /metrics           Prometheus text format: the node's metrics (gateway/metrics); needs the
                              token like every call (``metrics.listen`` serves them without one)

Every call but the two probes and the page's static files needs ``Authorization: Bearer <token>``
(``auth.py``: browser-driven requests are refused before the token is looked at; ``token.py``:
the generated token). The ``/bans`` handlers are in ``bans.py``; dangerous bans need ``force``
(``gateway/bans/policy.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from redis.exceptions import RedisError

from gateway import __version__
from gateway.admin import auth, statuspage
from gateway.admin import token as admin_token
from gateway.admin.bans import STORE_DOWN, BanHandlers, Bans
from gateway.admin.config_view import config_view
from gateway.admin.replies import json_reply
from gateway.bans.local import RedisBans
from gateway.clock import epoch_ms
from gateway.config.schema import ConfigSpec
from gateway.config.validate import is_loopback_host
from gateway.errors import StoreUnavailable
from gateway.logs import error as errorlog
from gateway.metrics.config import CONTENT_TYPE
from gateway.store.inspect import UnknownZone, ZoneState

ReloadReply = tuple[list[str], list[str]]  # (errors: nothing changed when any; notes: what did not apply)
log = errorlog.log

READY_TIMEOUT_S = 1.0  # the PING of /readyz
MAX_BODY = 16 * 1024 * 1024  # a 100,000-entry blocklist in one POST; read only after the token check


class AdminApi:
    def __init__(
        self,
        bans: Bans,
        reload: Callable[[], Awaitable[ReloadReply]],
        status: Callable[[], dict[str, Any]],
        token: str,
        *,
        config: Callable[[], ConfigSpec],
        serving: Callable[[], bool] = lambda: True,
        loopback: bool = True,
        token_file: str | None = None,
        activity: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        zone_state: ZoneState | None = None,
        metrics: Callable[[], Awaitable[bytes]] | None = None,
    ) -> None:
        self.zone_state = zone_state  # one key's limit state, in the embedded store or Redis
        self.metrics = metrics  # the Prometheus text of the node (gateway/metrics)
        self.bans = bans
        self.ban_handlers = BanHandlers(bans, config)
        self.reload = reload
        self.status = status
        # the token in force: admin.token, or the one in token_file, followed when it is rotated
        self.current = admin_token.Current(token_file, token) if token_file is not None else None
        self._token = token
        self.config = config  # the configuration in force
        self.serving = serving
        self.loopback = loopback  # the listener is on loopback: Host must be a loopback name
        self.token_file = token_file  # where the generated token is kept (None: admin.token)
        self.activity = activity  # the status page's data (None: this process has none)
        self.started = time.time()
        self.runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        bans = self.ban_handlers
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/", self._page)
        app.router.add_get("/status/page.js", self._page_file)
        app.router.add_get("/status/page.css", self._page_file)
        app.router.add_get("/favicon.ico", self._page_file)
        app.router.add_get("/status", self._status)
        app.router.add_get("/status/activity", self._activity)
        app.router.add_get("/bans", bans.list_bans)
        app.router.add_post("/bans", bans.add)
        app.router.add_post("/bans/remove", bans.remove_many)
        app.router.add_delete("/bans/{target:.+}", bans.remove)
        app.router.add_post("/reload", self._reload)
        app.router.add_get("/config", self._config)
        app.router.add_get("/zones/{zone}/{key:.+}", self._zone_show)
        app.router.add_delete("/zones/{zone}/{key:.+}", self._zone_reset)
        app.router.add_get("/metrics", self._metrics)
        return app

    @property
    def token(self) -> str:
        """The token calls must carry now."""
        return self.current.get() if self.current is not None else self._token

    async def start(self, host: str, port: int) -> None:
        """Listen; raises OSError."""
        self.runner = web.AppRunner(self.app(), access_log=None)
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, host, port, reuse_address=True).start()
        except BaseException:
            await self.runner.cleanup()
            self.runner = None
            raise

    async def close(self) -> None:
        closer = getattr(self.zone_state, "close", None)
        if closer is not None:
            await closer()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    # -- before any handler: browser checks, then the token (auth.py) ----------------------------
    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        refused = auth.refusal(
            request,
            self.token,
            loopback_listener=self.loopback,
            page=request.match_info.handler == self._page,
            public=self._public(request),
        )
        if refused is not None:
            return json_reply({"error": refused.reason}, refused.status, headers=refused.headers)
        try:
            return await handler(request)
        except StoreUnavailable:  # the ban list store (bans.py)
            return json_reply({"error": STORE_DOWN}, 503)

    def _public(self, request: web.Request) -> bool:
        handler = request.match_info.handler
        return request.method in ("GET", "HEAD") and handler in (
            self._healthz,
            self._readyz,
            self._page,
            self._page_file,
        )

    # -- handlers ---------------------------------------------------------------------------------
    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        """Ready while the node serves by its policy: a Redis outage makes it not ready only with
        ``on_error: deny``, where every limited request would be refused; the body says how Redis is."""
        if not self.serving():
            return json_reply({"ready": False, "reason": "not serving (starting or shutting down)"}, 503)
        redis = self.config().store.redis
        if redis is None:
            return json_reply({"ready": True})
        down = await self._redis_down()
        body: dict[str, Any] = {"ready": True, "redis": "down" if down else "up", "on_error": redis.on_error}
        if down is None:
            return json_reply(body)
        body["redis_error"] = down
        if redis.on_error == "deny":
            body["ready"] = False
            body["reason"] = f"Redis is unreachable ({down}) and store.redis.on_error is deny: requests are refused"
            return json_reply(body, 503)
        body["reason"] = f"Redis is unreachable ({down}); serving by on_error: {redis.on_error}"
        return json_reply(body)

    async def _redis_down(self) -> str | None:
        """Why Redis does not answer a PING within READY_TIMEOUT_S (None: it does)."""
        if not isinstance(self.bans, RedisBans):
            return None  # no client here to ask (bans come from elsewhere)
        try:
            await asyncio.wait_for(self.bans.client.ping(), READY_TIMEOUT_S)
        except Exception as exc:
            return type(exc).__name__
        return None

    async def _status(self, request: web.Request) -> web.Response:
        body = {"version": __version__, "pid": os.getpid(), "uptime_s": round(time.time() - self.started, 1)}
        body.update(self.status())
        return json_reply(body)

    async def _page(self, request: web.Request) -> web.Response:
        return statuspage.response("page.html")

    async def _page_file(self, request: web.Request) -> web.Response:
        return statuspage.response(request.path.rsplit("/", 1)[-1])

    async def _activity(self, request: web.Request) -> web.Response:
        if self.activity is None:
            return json_reply({"error": "no activity data on this process"}, 404)
        body = await self.activity()
        body["now_ms"] = epoch_ms()
        return json_reply(body)

    async def _zone_show(self, request: web.Request) -> web.Response:
        return await self._zone_call(request, reset=False)

    async def _zone_reset(self, request: web.Request) -> web.Response:
        return await self._zone_call(request, reset=True)

    async def _zone_call(self, request: web.Request, *, reset: bool) -> web.Response:
        zone, key = unquote(request.match_info["zone"]), unquote(request.match_info["key"])
        if self.zone_state is None:
            return json_reply({"error": "zone state is not available on this node"}, 501)
        try:
            if reset:
                found = await self.zone_state.reset(zone, key)
                return json_reply({"zone": zone, "key": key, "reset": found}, 200 if found else 404)
            state = await self.zone_state.show(zone, key)
        except UnknownZone:
            return json_reply({"error": f"unknown zone {zone!r}"}, 404)
        except ValueError as exc:
            return json_reply({"error": str(exc)}, 400)
        except (OSError, TimeoutError, RedisError) as exc:
            log.warning("admin API: reading zone state failed: %s", type(exc).__name__)
            return json_reply({"error": "the limit store (Redis) is unavailable; try again later"}, 503)
        if state is None:
            return json_reply({"error": f"no state for {key!r} in zone {zone!r}", "zone": zone, "key": key}, 404)
        return json_reply(state)

    async def _config(self, request: web.Request) -> web.Response:
        spec = self.config()
        text = await asyncio.to_thread(lambda: json.dumps(config_view(spec), indent=1) + "\n")
        return web.Response(text=text, content_type="application/json")

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics is None:
            return json_reply({"error": "no metrics here"}, 404)
        return web.Response(body=await self.metrics(), headers={"Content-Type": CONTENT_TYPE})

    async def _reload(self, request: web.Request) -> web.Response:
        errors, notes = await self.reload()
        return json_reply({"reloaded": not errors, "errors": errors, "notes": notes}, 200 if not errors else 400)


async def serve_admin(
    spec: ConfigSpec,
    bans: Bans,
    reload: Callable[[], Awaitable[ReloadReply]],
    status: Callable[[], dict[str, Any]],
    *,
    config: Callable[[], ConfigSpec],
    serving: Callable[[], bool],
    activity: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    zone_state: ZoneState | None = None,
    metrics: Callable[[], Awaitable[bytes]] | None = None,
) -> AdminApi | None:
    """Start the admin API on ``admin.listen`` (None, logged, when it cannot start)."""
    assert spec.admin.listen is not None
    host, port = spec.admin.listen
    token, token_file, created = spec.admin.token, None, False
    if token is None:
        token_file = admin_token.token_path(spec.admin.token_file, port)
        try:
            token, created = admin_token.load_or_create(token_file)
        except admin_token.TokenFileError as exc:
            log.error("admin API not started: %s", exc)
            return None
    api = AdminApi(
        bans,
        reload,
        status,
        token,
        config=config,
        serving=serving,
        loopback=is_loopback_host(host),
        token_file=token_file,
        activity=activity,
        zone_state=zone_state,
        metrics=metrics,
    )
    try:
        await api.start(host, port)
    except OSError as exc:
        log.error("admin API not started: bind() to %s:%s failed (%s)", host, port, exc.strerror)
        return None
    log.log(errorlog.NOTICE, "admin API on %s:%s", host, port)
    if token_file is not None:
        how = "new" if created else "kept from before"
        log.log(errorlog.NOTICE, "admin API token (%s) in %s; `gateway token --rotate` replaces it", how, token_file)
    return api
