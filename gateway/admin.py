"""The admin API, on ``admin.listen`` (default 127.0.0.1:9180), for operators and the CLI.

    GET    /healthz           "ok"                                    (no token needed)
    GET    /readyz            {"ready": true} or 503 {"ready": false, "reason": ...}  (no token needed)
    GET    /status            JSON: version, pid, store, Redis circuit, zones, bans
    GET    /bans              JSON list of bans in force
    POST   /bans              {"target": "203.0.113.7" | "10.0.0.0/8", "for": "1h" | 0, "reason": "...",
                               "force": false}
    DELETE /bans/{target}     target URL-encoded (10.0.0.0%2F8)
    POST   /reload            like SIGHUP; answers the configuration errors, if any

Every call but the two probes needs ``Authorization: Bearer <token>``: ``admin.token``, or,
when none is configured, a random one written to ``admin.token_file`` for the CLI
(``gateway/admin_token.py``). Browser-driven requests are refused before that
(``gateway/admin_guard.py``), and dangerous bans need ``force`` (``gateway/ban_policy.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote

from aiohttp import web

from gateway import __version__, admin_guard, admin_token, errorlog
from gateway.ban_policy import ban_refusal
from gateway.bans import Ban, LocalBans, RedisBans, canonical_target, epoch_ms
from gateway.config.schema import ConfigSpec
from gateway.config.units import parse_duration_ms

Bans = LocalBans | RedisBans
T = TypeVar("T")
log = errorlog.log

STORE_TIMEOUT_S = 2.0  # a ban list call to Redis
READY_TIMEOUT_S = 1.0  # the PING of /readyz
MAX_BODY = 64 * 1024
STORE_DOWN = "the ban list store (Redis) is unavailable; nothing was changed or read, try again later"


class StoreUnavailable(Exception):
    pass


class AdminApi:
    def __init__(
        self,
        bans: Bans,
        reload: Callable[[], Awaitable[list[str]]],
        status: Callable[[], dict[str, Any]],
        token: str,
        *,
        config: Callable[[], ConfigSpec],
        serving: Callable[[], bool] = lambda: True,
        loopback: bool = True,
        token_file: str | None = None,
    ) -> None:
        self.bans = bans
        self.reload = reload
        self.status = status
        self.token = token
        self.config = config  # the configuration in force (ban_policy reads real_ip.from and access.allow)
        self.serving = serving
        self.loopback = loopback  # the listener is on loopback: Host must be a loopback name
        self.token_file = token_file  # where the generated token was published (None: admin.token)
        self.started = time.time()
        self.runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/status", self._status)
        app.router.add_get("/bans", self._list)
        app.router.add_post("/bans", self._add)
        app.router.add_delete("/bans/{target:.+}", self._remove)
        app.router.add_post("/reload", self._reload)
        return app

    async def start(self, host: str, port: int) -> None:
        """Listen, then publish the generated token (if any); raises OSError or TokenFileError."""
        self.runner = web.AppRunner(self.app(), access_log=None)
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, host, port, reuse_address=True).start()
            if self.token_file is not None:
                admin_token.publish(self.token_file, self.token)
        except BaseException:
            await self.runner.cleanup()
            self.runner = None
            raise

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
            if self.token_file is not None:
                admin_token.withdraw(self.token_file, self.token)

    # -- before any handler: browser checks, then the token -------------------------------------
    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        refused = admin_guard.refusal(request, loopback_listener=self.loopback)
        if refused is not None:
            return _json({"error": refused[1]}, refused[0])
        if not self._public(request):
            problem = self._token_problem(request)
            if problem is not None:
                return _json({"error": problem}, 401, headers={"WWW-Authenticate": 'Bearer realm="gateway admin"'})
        try:
            return await handler(request)
        except StoreUnavailable:
            return _json({"error": STORE_DOWN}, 503)

    def _public(self, request: web.Request) -> bool:
        handler = request.match_info.handler
        return request.method in ("GET", "HEAD") and handler in (self._healthz, self._readyz)

    def _token_problem(self, request: web.Request) -> str | None:
        values = request.headers.getall("Authorization", ())
        if not values:
            return "this call needs the admin token (Authorization: Bearer <token>)"
        value = values[0]
        # Non-UTF-8 bytes arrive as surrogate escapes: not ASCII, so refused here, never encoded.
        if len(values) > 1 or not value.isascii() or not value.isprintable():
            return "malformed Authorization header"
        scheme, _, given = value.strip().partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return "malformed Authorization header: expected Bearer <token>"
        if not hmac.compare_digest(given.strip().encode("ascii"), self.token.encode("utf-8")):
            return "wrong admin token"
        return None

    async def _store(self, call: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(call, STORE_TIMEOUT_S)
        except Exception as exc:
            log.warning("admin API: the ban list store failed: %s", type(exc).__name__)
            raise StoreUnavailable from None

    # -- handlers ---------------------------------------------------------------------------------
    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if not self.serving():
            return _json({"ready": False, "reason": "not serving (starting or shutting down)"}, 503)
        if isinstance(self.bans, RedisBans):
            try:
                await asyncio.wait_for(self.bans.client.ping(), READY_TIMEOUT_S)
            except Exception as exc:
                return _json({"ready": False, "reason": f"Redis is unreachable ({type(exc).__name__})"}, 503)
        return _json({"ready": True})

    async def _status(self, request: web.Request) -> web.Response:
        body = {"version": __version__, "pid": os.getpid(), "uptime_s": round(time.time() - self.started, 1)}
        body.update(self.status())
        return _json(body)

    async def _list(self, request: web.Request) -> web.Response:
        bans = await self._store(self.bans.list())
        return _json([ban_view(b) for b in bans])

    async def _add(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
        except ValueError:
            return _json({"error": "bad ban request: the body must be a JSON object"}, 400)
        if not isinstance(data, dict):
            return _json({"error": "bad ban request: the body must be a JSON object"}, 400)
        try:
            target = canonical_target(data["target"]) if isinstance(data.get("target"), str) else ""
        except ValueError:
            target = ""
        if not target:
            return _json({"error": 'bad ban request: "target" must be an IP address or CIDR'}, 400)
        try:
            duration_ms = parse_duration_ms(data.get("for", "1h"))
        except ValueError:
            return _json({"error": 'bad ban request: "for" must be a duration such as 30s, 10m, 1h, or 0'}, 400)
        force = data.get("force", False)
        if not isinstance(force, bool):
            return _json({"error": 'bad ban request: "force" must be true or false'}, 400)
        refusal = ban_refusal(target, self.config())
        if refusal is not None and not force:
            return _json({"error": f'ban refused: {refusal}; send "force": true to ban anyway', "reason": refusal}, 409)
        now = epoch_ms()
        ban = Ban(
            target=target,
            until_ms=now + duration_ms if duration_ms else 0,
            reason=str(data.get("reason", "")),
            created_ms=now,
            by=str(data.get("by", "admin api")),
        )
        await self._store(self.bans.add(ban))
        return _json(ban_view(ban), 201)

    async def _remove(self, request: web.Request) -> web.Response:
        try:
            target = canonical_target(unquote(request.match_info["target"]))
        except ValueError:
            return _json({"error": "the target must be an IP address or CIDR"}, 400)
        found = await self._store(self.bans.remove(target))
        return _json({"target": target, "removed": found}, 200 if found else 404)

    async def _reload(self, request: web.Request) -> web.Response:
        errors = await self.reload()
        return _json({"reloaded": not errors, "errors": errors}, 200 if not errors else 400)


async def serve_admin(
    spec: ConfigSpec,
    bans: Bans,
    reload: Callable[[], Awaitable[list[str]]],
    status: Callable[[], dict[str, Any]],
    *,
    config: Callable[[], ConfigSpec],
    serving: Callable[[], bool],
) -> AdminApi | None:
    """Start the admin API on ``admin.listen`` (None, logged, when it cannot start)."""
    assert spec.admin.listen is not None
    host, port = spec.admin.listen
    token, token_file = spec.admin.token, None
    if token is None:
        token = admin_token.new_token()
        token_file = admin_token.token_path(spec.admin.token_file, port)
    api = AdminApi(
        bans,
        reload,
        status,
        token,
        config=config,
        serving=serving,
        loopback=admin_guard.is_loopback_host(host),
        token_file=token_file,
    )
    try:
        await api.start(host, port)
    except OSError as exc:
        log.error("admin API not started: bind() to %s:%s failed (%s)", host, port, exc.strerror)
        return None
    except admin_token.TokenFileError as exc:
        log.error("admin API not started: %s", exc)
        return None
    log.log(errorlog.NOTICE, "admin API on %s:%s", host, port)
    if token_file is not None:
        log.log(errorlog.NOTICE, "admin API token (generated) in %s", token_file)
    return api


def ban_view(ban: Ban) -> dict[str, Any]:
    now = epoch_ms()
    return {
        "target": ban.target,
        "until_ms": ban.until_ms,
        "remaining_s": None if ban.until_ms == 0 else max(0, -(-(ban.until_ms - now) // 1000)),
        "reason": ban.reason,
        "created_ms": ban.created_ms,
        "by": ban.by,
    }


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=json.dumps(body, indent=1) + "\n", status=status, content_type="application/json", headers=headers
    )
