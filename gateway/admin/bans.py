"""The admin API's ban calls, and how a ban reads in a request and in a reply.

    GET    /bans              JSON list of bans in force, sorted by target; X-Total-Count: how many
                              match. ?match=10.0.0.0/8 &reason=feed &limit=100 &offset=0
                              (limit defaults to 1000, at most 100000)
    POST   /bans              one ban, or many with ``"bans": [...]`` (``api.py`` has the shapes)
    DELETE /bans/{target}     target URL-encoded (10.0.0.0%2F8)
    POST   /bans/remove       {"targets": [...]} -> {"removed": N, "not_banned": [...], "invalid": [...]}

The bans are kept by ``LocalBans`` or ``RedisBans`` (``gateway/bans/``); a call to them that
fails or takes too long raises ``StoreUnavailable``, which the API answers with 503 and
``STORE_DOWN``. Dangerous bans need ``force`` (``gateway/bans/policy.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote

from aiohttp import web

from gateway.admin.replies import json_reply
from gateway.bans.local import Ban, LocalBans, RedisBans, canonical_target
from gateway.bans.policy import BanPolicy
from gateway.clock import epoch_ms
from gateway.config.schema import ConfigSpec
from gateway.config.units import parse_duration_ms
from gateway.errors import BanStoreError, StoreUnavailable
from gateway.logs import error as errorlog

Bans = LocalBans | RedisBans
T = TypeVar("T")
log = errorlog.log

STORE_TIMEOUT_S = 2.0  # a ban list call to Redis (a bulk call gets this per 10,000 entries)
MAX_BULK = 200_000  # entries in one POST
LIST_LIMIT = 1000  # GET /bans without ?limit
MAX_LIST_LIMIT = 100_000  # one page at most (built in a thread: the serving loop never waits on it)
STORE_DOWN = "the ban list store (Redis) is unavailable; nothing was changed or read, try again later"


class BanHandlers:
    """The handlers of the ``/bans`` routes, on this node's bans and the configuration in force."""

    def __init__(self, bans: Bans, config: Callable[[], ConfigSpec]) -> None:
        self.bans = bans
        self.config = config  # BanPolicy reads real_ip.from and access.allow

    async def _store(self, call: Awaitable[T], entries: int = 1) -> T:
        try:
            return await asyncio.wait_for(call, STORE_TIMEOUT_S * (1 + entries // 10_000))
        except Exception as exc:
            log.warning(
                "admin API: the ban list store failed: %s",
                exc if isinstance(exc, BanStoreError) else type(exc).__name__,
            )
            raise StoreUnavailable(STORE_DOWN) from None

    async def list_bans(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            limit = _count(query.get("limit"), LIST_LIMIT, 1, MAX_LIST_LIMIT)
            offset = _count(query.get("offset"), 0, 0, 10**9)
        except ValueError:
            return json_reply({"error": "limit and offset must be whole numbers (limit 1..100000)"}, 400)
        within = query.get("match") or None
        if within is not None:
            try:
                within = canonical_target(within)
            except ValueError:
                return json_reply({"error": "match must be an IP address or CIDR"}, 400)
        reason = query.get("reason")
        total, page = await self._store(self.bans.select(within=within, reason=reason, offset=offset, limit=limit))
        text = await asyncio.to_thread(lambda: json.dumps([ban_view(b) for b in page], indent=1) + "\n")
        return web.Response(text=text, content_type="application/json", headers={"X-Total-Count": str(total)})

    async def add(self, request: web.Request) -> web.Response:
        data = await _body(request)
        if data is None:
            return json_reply({"error": "bad ban request: the body must be a JSON object"}, 400)
        force = data.get("force", False)
        if not isinstance(force, bool):
            return json_reply({"error": 'bad ban request: "force" must be true or false'}, 400)
        if "bans" in data:
            return await self._add_many(data, force)
        try:
            ban = parse_ban(data, data, epoch_ms())
        except ValueError as exc:
            return json_reply({"error": f"bad ban request: {exc}"}, 400)
        refusal = BanPolicy(self.config()).refusal(ban.target)
        if refusal is not None and not force:
            return json_reply(
                {"error": f'ban refused: {refusal}; send "force": true to ban anyway', "reason": refusal}, 409
            )
        await self._store(self.bans.add(ban))
        return json_reply(ban_view(ban), 201)

    async def _add_many(self, data: dict[str, Any], force: bool) -> web.Response:
        entries = data["bans"]
        if not isinstance(entries, list) or len(entries) > MAX_BULK:
            return json_reply({"error": f'bad ban request: "bans" must be a list of at most {MAX_BULK} entries'}, 400)
        try:
            parse_ban({"target": "192.0.2.1"}, data, 0)  # the defaults themselves must be valid
        except ValueError as exc:
            return json_reply({"error": f"bad ban request: {exc}"}, 400)
        policy = BanPolicy(self.config())
        now = epoch_ms()
        bans: dict[str, Ban] = {}
        refused: list[dict[str, Any]] = []
        invalid: list[dict[str, Any]] = []
        for index, entry in enumerate(entries):
            try:
                ban = parse_ban({"target": entry} if isinstance(entry, str) else entry, data, now)
            except ValueError as exc:
                invalid.append({"index": index, "error": str(exc)})
                continue
            refusal = policy.refusal(ban.target)
            if refusal is not None and not force:
                refused.append({"index": index, "target": ban.target, "reason": refusal})
                continue
            bans[ban.target] = ban
        await self._store(self.bans.add_many(list(bans.values())), len(bans))
        return json_reply({"banned": len(bans), "refused": refused, "invalid": invalid})

    async def remove_many(self, request: web.Request) -> web.Response:
        data = await _body(request)
        targets = data.get("targets") if data is not None else None
        if not isinstance(targets, list) or len(targets) > MAX_BULK:
            return json_reply({"error": f'bad request: "targets" must be a list of at most {MAX_BULK} entries'}, 400)
        valid: list[str] = []
        invalid: list[dict[str, Any]] = []
        for index, item in enumerate(targets):
            try:
                valid.append(canonical_target(item if isinstance(item, str) else ""))
            except ValueError:
                invalid.append({"index": index, "error": "not an IP address or CIDR"})
        found = await self._store(self.bans.remove_many(valid), len(valid))
        missing = sorted(set(valid) - set(found))
        return json_reply({"removed": len(set(found)), "not_banned": missing, "invalid": invalid})

    async def remove(self, request: web.Request) -> web.Response:
        try:
            target = canonical_target(unquote(request.match_info["target"]))
        except ValueError:
            return json_reply({"error": "the target must be an IP address or CIDR"}, 400)
        found = await self._store(self.bans.remove(target))
        return json_reply({"target": target, "removed": found}, 200 if found else 404)


async def _body(request: web.Request) -> dict[str, Any] | None:
    try:
        data = await request.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _count(text: str | None, default: int, low: int, high: int) -> int:
    if text is None or text == "":
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 10) or not low <= int(text) <= high:
        raise ValueError("out of range")
    return int(text)


def parse_ban(entry: Any, defaults: dict[str, Any], now: int) -> Ban:
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
    """A ban as the API and the CLI show it: with the seconds it has left (None: no end)."""
    now = epoch_ms()
    return {
        "target": ban.target,
        "until_ms": ban.until_ms,
        "remaining_s": None if ban.until_ms == 0 else max(0, -(-(ban.until_ms - now) // 1000)),
        "reason": ban.reason,
        "created_ms": ban.created_ms,
        "by": ban.by,
    }
