"""The admin API, on ``admin.listen`` (default 127.0.0.1:9180), for operators and the CLI.

    GET    /healthz           "ok"                                    (no token needed)
    GET    /readyz            {"ready": true} or 503 {"ready": false, "reason": ...}  (no token needed)
    GET    /                  the status page (HTML without data; its script asks for the token)
    GET    /status/page.js, /status/page.css, /favicon.ico   the page's own files (no token needed)
    GET    /status            JSON: version, pid, store, Redis circuit, zones, bans
    GET    /status/activity   JSON for the status page: per-zone passed/delayed/rejected per 10 s
                              bucket, the most rejected keys, upstream health, the Redis circuit,
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

Every call but the two probes and the page's static files needs ``Authorization: Bearer <token>``: ``admin.token``, or,
when none is configured, a random one written to ``admin.token_file`` for the CLI
(``gateway/admin/token.py``). Browser-driven requests are refused before that
(``gateway/admin/guard.py``), and dangerous bans need ``force`` (``gateway/bans/policy.py``).
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
from redis.exceptions import RedisError

from gateway import __version__
from gateway.admin import guard as admin_guard
from gateway.admin import statuspage
from gateway.admin import token as admin_token
from gateway.admin.config_view import config_view
from gateway.bans.local import Ban, LocalBans, RedisBans, canonical_target, epoch_ms
from gateway.bans.policy import BanPolicy
from gateway.config.schema import ConfigSpec
from gateway.config.units import parse_duration_ms
from gateway.config.validate import is_loopback_host
from gateway.logs import error as errorlog
from gateway.metrics.config import CONTENT_TYPE
from gateway.store.inspect import UnknownZone, ZoneState

Bans = LocalBans | RedisBans
ReloadReply = tuple[list[str], list[str]]  # (errors: nothing changed when any; notes: what did not apply)
T = TypeVar("T")
log = errorlog.log

STORE_TIMEOUT_S = 2.0  # a ban list call to Redis (a bulk call gets this per 10,000 entries)
READY_TIMEOUT_S = 1.0  # the PING of /readyz
MAX_BODY = 16 * 1024 * 1024  # a 100,000-entry blocklist in one POST; read only after the token check
MAX_BULK = 200_000  # entries in one POST
LIST_LIMIT = 1000  # GET /bans without ?limit
MAX_LIST_LIMIT = 100_000  # one page at most (built in a thread: the serving loop never waits on it)
STORE_DOWN = "the ban list store (Redis) is unavailable; nothing was changed or read, try again later"


class StoreUnavailable(Exception):
    pass


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
        self.reload = reload
        self.status = status
        self.token = token
        self.config = config  # the configuration in force (ban_policy reads real_ip.from and access.allow)
        self.serving = serving
        self.loopback = loopback  # the listener is on loopback: Host must be a loopback name
        self.token_file = token_file  # where the generated token was published (None: admin.token)
        self.activity = activity  # the status page's data (None: this process has none)
        self.started = time.time()
        self.runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/", self._page)
        app.router.add_get("/status/page.js", self._page_file)
        app.router.add_get("/status/page.css", self._page_file)
        app.router.add_get("/favicon.ico", self._page_file)
        app.router.add_get("/status", self._status)
        app.router.add_get("/status/activity", self._activity)
        app.router.add_get("/bans", self._list)
        app.router.add_post("/bans", self._add)
        app.router.add_post("/bans/remove", self._remove_many)
        app.router.add_delete("/bans/{target:.+}", self._remove)
        app.router.add_post("/reload", self._reload)
        app.router.add_get("/config", self._config)
        app.router.add_get("/zones/{zone}/{key:.+}", self._zone_show)
        app.router.add_delete("/zones/{zone}/{key:.+}", self._zone_reset)
        app.router.add_get("/metrics", self._metrics)
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
        closer = getattr(self.zone_state, "close", None)
        if closer is not None:
            await closer()
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
        page = request.match_info.handler == self._page
        refused = admin_guard.refusal(request, loopback_listener=self.loopback, page=page)
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
        return request.method in ("GET", "HEAD") and handler in (
            self._healthz,
            self._readyz,
            self._page,
            self._page_file,
        )

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

    async def _store(self, call: Awaitable[T], entries: int = 1) -> T:
        try:
            return await asyncio.wait_for(call, STORE_TIMEOUT_S * (1 + entries // 10_000))
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

    async def _page(self, request: web.Request) -> web.Response:
        return statuspage.response("page.html")

    async def _page_file(self, request: web.Request) -> web.Response:
        return statuspage.response(request.path.rsplit("/", 1)[-1])

    async def _activity(self, request: web.Request) -> web.Response:
        if self.activity is None:
            return _json({"error": "no activity data on this process"}, 404)
        body = await self.activity()
        body["now_ms"] = epoch_ms()
        return _json(body)

    async def _list(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            limit = _count(query.get("limit"), LIST_LIMIT, 1, MAX_LIST_LIMIT)
            offset = _count(query.get("offset"), 0, 0, 10**9)
        except ValueError:
            return _json({"error": "limit and offset must be whole numbers (limit 1..100000)"}, 400)
        within = query.get("match") or None
        if within is not None:
            try:
                within = canonical_target(within)
            except ValueError:
                return _json({"error": "match must be an IP address or CIDR"}, 400)
        reason = query.get("reason")
        total, page = await self._store(self.bans.select(within=within, reason=reason, offset=offset, limit=limit))
        text = await asyncio.to_thread(lambda: json.dumps([ban_view(b) for b in page], indent=1) + "\n")
        return web.Response(text=text, content_type="application/json", headers={"X-Total-Count": str(total)})

    async def _body(self, request: web.Request) -> dict[str, Any] | None:
        try:
            data = await request.json()
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    async def _add(self, request: web.Request) -> web.Response:
        data = await self._body(request)
        if data is None:
            return _json({"error": "bad ban request: the body must be a JSON object"}, 400)
        force = data.get("force", False)
        if not isinstance(force, bool):
            return _json({"error": 'bad ban request: "force" must be true or false'}, 400)
        if "bans" in data:
            return await self._add_many(data, force)
        try:
            ban = _ban(data, data, epoch_ms())
        except ValueError as exc:
            return _json({"error": f"bad ban request: {exc}"}, 400)
        refusal = BanPolicy(self.config()).refusal(ban.target)
        if refusal is not None and not force:
            return _json({"error": f'ban refused: {refusal}; send "force": true to ban anyway', "reason": refusal}, 409)
        await self._store(self.bans.add(ban))
        return _json(ban_view(ban), 201)

    async def _add_many(self, data: dict[str, Any], force: bool) -> web.Response:
        entries = data["bans"]
        if not isinstance(entries, list) or len(entries) > MAX_BULK:
            return _json({"error": f'bad ban request: "bans" must be a list of at most {MAX_BULK} entries'}, 400)
        try:
            _ban({"target": "192.0.2.1"}, data, 0)  # the defaults themselves must be valid
        except ValueError as exc:
            return _json({"error": f"bad ban request: {exc}"}, 400)
        policy = BanPolicy(self.config())
        now = epoch_ms()
        bans: dict[str, Ban] = {}
        refused: list[dict[str, Any]] = []
        invalid: list[dict[str, Any]] = []
        for index, entry in enumerate(entries):
            try:
                ban = _ban({"target": entry} if isinstance(entry, str) else entry, data, now)
            except ValueError as exc:
                invalid.append({"index": index, "error": str(exc)})
                continue
            refusal = policy.refusal(ban.target)
            if refusal is not None and not force:
                refused.append({"index": index, "target": ban.target, "reason": refusal})
                continue
            bans[ban.target] = ban
        await self._store(self.bans.add_many(list(bans.values())), len(bans))
        return _json({"banned": len(bans), "refused": refused, "invalid": invalid})

    async def _remove_many(self, request: web.Request) -> web.Response:
        data = await self._body(request)
        targets = data.get("targets") if data is not None else None
        if not isinstance(targets, list) or len(targets) > MAX_BULK:
            return _json({"error": f'bad request: "targets" must be a list of at most {MAX_BULK} entries'}, 400)
        valid: list[str] = []
        invalid: list[dict[str, Any]] = []
        for index, item in enumerate(targets):
            try:
                valid.append(canonical_target(item if isinstance(item, str) else ""))
            except ValueError:
                invalid.append({"index": index, "error": "not an IP address or CIDR"})
        found = await self._store(self.bans.remove_many(valid), len(valid))
        missing = sorted(set(valid) - set(found))
        return _json({"removed": len(set(found)), "not_banned": missing, "invalid": invalid})

    async def _remove(self, request: web.Request) -> web.Response:
        try:
            target = canonical_target(unquote(request.match_info["target"]))
        except ValueError:
            return _json({"error": "the target must be an IP address or CIDR"}, 400)
        found = await self._store(self.bans.remove(target))
        return _json({"target": target, "removed": found}, 200 if found else 404)

    async def _zone_show(self, request: web.Request) -> web.Response:
        return await self._zone_call(request, reset=False)

    async def _zone_reset(self, request: web.Request) -> web.Response:
        return await self._zone_call(request, reset=True)

    async def _zone_call(self, request: web.Request, *, reset: bool) -> web.Response:
        zone, key = unquote(request.match_info["zone"]), unquote(request.match_info["key"])
        if self.zone_state is None:
            return _json({"error": "zone state is not available on this node"}, 501)
        try:
            if reset:
                found = await self.zone_state.reset(zone, key)
                return _json({"zone": zone, "key": key, "reset": found}, 200 if found else 404)
            state = await self.zone_state.show(zone, key)
        except UnknownZone:
            return _json({"error": f"unknown zone {zone!r}"}, 404)
        except ValueError as exc:
            return _json({"error": str(exc)}, 400)
        except (OSError, TimeoutError, RedisError) as exc:
            log.warning("admin API: reading zone state failed: %s", type(exc).__name__)
            return _json({"error": "the limit store (Redis) is unavailable; try again later"}, 503)
        if state is None:
            return _json({"error": f"no state for {key!r} in zone {zone!r}", "zone": zone, "key": key}, 404)
        return _json(state)

    async def _config(self, request: web.Request) -> web.Response:
        spec = self.config()
        text = await asyncio.to_thread(lambda: json.dumps(config_view(spec), indent=1) + "\n")
        return web.Response(text=text, content_type="application/json")

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics is None:
            return _json({"error": "no metrics here"}, 404)
        return web.Response(body=await self.metrics(), headers={"Content-Type": CONTENT_TYPE})

    async def _reload(self, request: web.Request) -> web.Response:
        errors, notes = await self.reload()
        return _json({"reloaded": not errors, "errors": errors, "notes": notes}, 200 if not errors else 400)


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
    except admin_token.TokenFileError as exc:
        log.error("admin API not started: %s", exc)
        return None
    log.log(errorlog.NOTICE, "admin API on %s:%s", host, port)
    if token_file is not None:
        log.log(errorlog.NOTICE, "admin API token (generated) in %s", token_file)
    return api


def _count(text: str | None, default: int, low: int, high: int) -> int:
    if text is None or text == "":
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 10) or not low <= int(text) <= high:
        raise ValueError("out of range")
    return int(text)


def _ban(entry: Any, defaults: dict[str, Any], now: int) -> Ban:
    """One ban from a request entry (``for`` and ``reason`` default to the request's); ValueError names the field."""
    if not isinstance(entry, dict):
        raise ValueError("an entry must be an IP address or CIDR, or an object")
    try:
        target = canonical_target(entry["target"]) if isinstance(entry.get("target"), str) else ""
    except ValueError:
        target = ""
    if not target:
        raise ValueError('"target" must be an IP address or CIDR')
    try:
        duration_ms = parse_duration_ms(entry.get("for", defaults.get("for", "1h")))
    except ValueError:
        raise ValueError('"for" must be a duration such as 30s, 10m, 1h, or 0') from None
    reason = entry.get("reason", defaults.get("reason", ""))
    by = entry.get("by", defaults.get("by", "admin api"))
    if not isinstance(reason, str) or not isinstance(by, str) or len(reason) > 200 or len(by) > 100:
        raise ValueError('"reason" and "by" must be short strings')
    return Ban(target=target, until_ms=now + duration_ms if duration_ms else 0, reason=reason, created_ms=now, by=by)


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
