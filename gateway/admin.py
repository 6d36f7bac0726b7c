"""The admin API, on ``admin.listen`` (default 127.0.0.1:9180), for operators and the CLI.

    GET    /healthz           "ok"
    GET    /status            JSON: version, pid, store, Redis circuit, zones, bans
    GET    /bans              JSON list of bans in force
    POST   /bans              {"target": "203.0.113.7" | "10.0.0.0/8", "for": "1h" | 0, "reason": "..."}
    DELETE /bans/{target}     target URL-encoded (10.0.0.0%2F8)
    POST   /reload            like SIGHUP; answers the configuration errors, if any

With ``admin.token`` set, every call needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from gateway import __version__
from gateway.bans import Ban, LocalBans, RedisBans, canonical_target, epoch_ms
from gateway.config.units import parse_duration_ms

Bans = LocalBans | RedisBans


class AdminApi:
    def __init__(
        self,
        bans: Bans,
        reload: Callable[[], Awaitable[list[str]]],
        status: Callable[[], dict[str, Any]],
        token: str | None,
    ) -> None:
        self.bans = bans
        self.reload = reload
        self.status = status
        self.token = token
        self.started = time.time()
        self.runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/status", self._status)
        app.router.add_get("/bans", self._list)
        app.router.add_post("/bans", self._add)
        app.router.add_delete("/bans/{target:.+}", self._remove)
        app.router.add_post("/reload", self._reload)
        return app

    async def start(self, host: str, port: int) -> None:
        self.runner = web.AppRunner(self.app(), access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, host, port, reuse_address=True).start()

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return _json({"error": "missing or wrong admin token"}, 401)
        return await handler(request)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _status(self, request: web.Request) -> web.Response:
        body = {"version": __version__, "pid": os.getpid(), "uptime_s": round(time.time() - self.started, 1)}
        body.update(self.status())
        return _json(body)

    async def _list(self, request: web.Request) -> web.Response:
        bans = await self.bans.list()
        return _json([ban_view(b) for b in bans])

    async def _add(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            target = canonical_target(str(data["target"]))
            duration = data.get("for", "1h")
            duration_ms = parse_duration_ms(duration)
        except (ValueError, KeyError, TypeError) as exc:
            return _json({"error": f"bad ban request: {exc}"}, 400)
        now = epoch_ms()
        ban = Ban(
            target=target,
            until_ms=now + duration_ms if duration_ms else 0,
            reason=str(data.get("reason", "")),
            created_ms=now,
            by=str(data.get("by", "admin api")),
        )
        await self.bans.add(ban)
        return _json(ban_view(ban), 201)

    async def _remove(self, request: web.Request) -> web.Response:
        try:
            target = canonical_target(unquote(request.match_info["target"]))
        except ValueError as exc:
            return _json({"error": str(exc)}, 400)
        found = await self.bans.remove(target)
        return _json({"target": target, "removed": found}, 200 if found else 404)

    async def _reload(self, request: web.Request) -> web.Response:
        errors = await self.reload()
        return _json({"reloaded": not errors, "errors": errors}, 200 if not errors else 400)


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


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body, indent=1) + "\n", status=status, content_type="application/json")
