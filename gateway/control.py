"""The operator commands that act on running gateways: reload, ban, unban, bans.

With ``store.redis`` configured, ban commands write to Redis themselves (every
node follows the shared list); otherwise they, and ``reload`` always, go to the
running node's admin API.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any
from urllib.parse import quote

import aiohttp

from gateway.bans import Ban, BanList, RedisBans, canonical_target, epoch_ms
from gateway.config import load_config
from gateway.config.schema import ConfigSpec
from gateway.config.units import parse_duration_ms


class ControlError(Exception):
    pass


def run_control(args: argparse.Namespace) -> int:
    spec = load_config(args.config).spec
    try:
        return asyncio.run(_dispatch(args, spec))
    except ControlError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1


async def _dispatch(args: argparse.Namespace, spec: ConfigSpec) -> int:
    if args.command == "reload":
        reply = await _admin(spec, "POST", "/reload")
        if reply.get("errors"):
            for error in reply["errors"]:
                print(f"gateway: {error}", file=sys.stderr)
            print("reload failed: the running configuration stays", file=sys.stderr)
            return 1
        print("reloaded")
        return 0
    if args.command == "ban":
        try:
            target = canonical_target(args.target)
            duration = parse_duration_ms(args.duration)
        except ValueError as exc:
            raise ControlError(str(exc)) from None
        if spec.store.redis is not None:
            now = epoch_ms()
            ban = Ban(target, now + duration if duration else 0, args.reason, now, "cli")
            bans = _redis_bans(spec)
            try:
                await bans.add(ban)
            finally:
                await bans.client.aclose()
        else:
            await _admin(
                spec, "POST", "/bans", {"target": target, "for": args.duration, "reason": args.reason, "by": "cli"}
            )
        print(f"banned {target} " + (f"for {args.duration}" if duration else "until unbanned"))
        return 0
    if args.command == "unban":
        try:
            target = canonical_target(args.target)
        except ValueError as exc:
            raise ControlError(str(exc)) from None
        if spec.store.redis is not None:
            bans = _redis_bans(spec)
            try:
                found = await bans.remove(target)
            finally:
                await bans.client.aclose()
        else:
            found = (await _admin(spec, "DELETE", "/bans/" + quote(target, safe=""), allow=(404,)))["removed"]
        print(f"unbanned {target}" if found else f"{target} was not banned")
        return 0 if found else 1
    # bans
    if spec.store.redis is not None:
        bans = _redis_bans(spec)
        try:
            listed = [_view(b) for b in await bans.list()]
        finally:
            await bans.client.aclose()
    else:
        listed = await _admin(spec, "GET", "/bans")
    if args.json:
        print(json.dumps(listed, indent=1))
        return 0
    if not listed:
        print("no bans in force")
        return 0
    print(f"{'TARGET':<40} {'REMAINING':>10}  REASON")
    for item in listed:
        remaining = "forever" if item["remaining_s"] is None else f"{item['remaining_s']}s"
        print(f"{item['target']:<40} {remaining:>10}  {item['reason']}")
    return 0


def _view(ban: Ban) -> dict[str, Any]:
    from gateway.admin import ban_view

    return ban_view(ban)


def _redis_bans(spec: ConfigSpec) -> RedisBans:
    from gateway.store.redis import connect

    redis_spec = spec.store.redis
    assert redis_spec is not None
    client = connect(redis_spec, max(2.0, redis_spec.timeout_ms / 1000))
    return RedisBans(client, redis_spec.prefix.encode(), BanList(), sync_interval_s=3600)


async def _admin(spec: ConfigSpec, method: str, path: str, body: Any = None, allow: tuple[int, ...] = ()) -> Any:
    if spec.admin.listen is None:
        raise ControlError("the admin API is off (admin.listen) and there is no Redis store to act on")
    host, port = spec.admin.listen
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    headers = {"Authorization": f"Bearer {spec.admin.token}"} if spec.admin.token else {}
    url = f"http://{host if ':' not in host else '[' + host + ']'}:{port}{path}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            async with session.request(method, url, json=body, headers=headers) as resp:
                text = await resp.text()
                if resp.status >= 400 and resp.status not in allow and not (path == "/reload" and resp.status == 400):
                    raise ControlError(f"admin API answered {resp.status}: {text.strip()}")
                return json.loads(text)
    except aiohttp.ClientError as exc:
        raise ControlError(f"cannot reach the admin API at {host}:{port} ({exc}); is the gateway running?") from None
