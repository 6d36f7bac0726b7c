"""The operator commands that act on running gateways: reload, ban, unban, bans.

With ``store.redis`` configured, ban commands write to Redis themselves (every
node follows the shared list); otherwise they, and ``reload`` always, go to the
running node's admin API, with ``admin.token`` or, when none is configured, the
token the gateway wrote to ``admin.token_file``.

``ban --file`` / ``unban --file`` read a blocklist (``gateway/bans/blocklist.py``): the valid
lines are applied (to Redis in pipelined chunks, or to the admin API 10,000 at a time);
each skipped line is reported as ``gateway: FILE:LINE: why`` and the exit code is then 1.

Any failure is one line on stderr (``gateway: ...``) and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import aiohttp

from gateway.admin import token as admin_token
from gateway.bans.blocklist import MAX_ERRORS_SHOWN, Blocklist, read_blocklist
from gateway.bans.local import Ban, BanList, RedisBans, canonical_target
from gateway.bans.policy import BanPolicy, ban_refusal
from gateway.clock import epoch_ms
from gateway.config.schema import ConfigSpec
from gateway.config.units import parse_duration_ms
from gateway.plan import load_config

T = TypeVar("T")
REDIS_TIMEOUT_S = 5.0  # one CLI command against Redis, connection included
ADMIN_TIMEOUT_S = 15.0  # one call to the admin API (a reload parses the file)
ADMIN_CHUNK = 10_000  # blocklist entries per admin API call
LIST_BUDGET = 50_000  # `gateway bans` with Redis: the time budget of a write of this many entries (30 s)


class ControlError(Exception):
    pass


def run_control(args: argparse.Namespace) -> int:
    spec = load_config(args.config).spec
    try:
        return asyncio.run(_dispatch(args, spec))
    except ControlError as exc:
        print(f"gateway: {_one_line(str(exc))}", file=sys.stderr)
    except Exception as exc:  # a bug or an unforeseen failure: still one line, no traceback
        print(f"gateway: {args.command} failed: {_one_line(f'{type(exc).__name__}: {exc}')}", file=sys.stderr)
    return 1


async def _dispatch(args: argparse.Namespace, spec: ConfigSpec) -> int:
    if args.command == "reload":
        reply = await _admin(spec, "POST", "/reload", {})
        if reply.get("errors"):
            for error in reply["errors"]:
                print(f"gateway: {error}", file=sys.stderr)
            print("reload failed: the running configuration stays", file=sys.stderr)
            return 1
        for note in reply.get("notes") or ():
            print(f"gateway: note: {note}", file=sys.stderr)
        print("reloaded")
        return 0
    if args.command == "zone":
        return await _zone(args, spec)
    if args.command == "ban":
        return await (_ban_file(args, spec) if args.file is not None else _ban(args, spec))
    if args.command == "unban":
        return await (_unban_file(args, spec) if args.file is not None else _unban(args, spec))
    return await _list(args, spec)


async def _zone(args: argparse.Namespace, spec: ConfigSpec) -> int:
    path = "/zones/" + quote(args.zone, safe="") + "/" + quote(args.key, safe="")
    if args.action == "reset":
        reply = await _admin(spec, "DELETE", path, {}, allow=(404,))
        if reply.get("reset"):
            print(f"reset {args.key} in zone {args.zone}")
            return 0
        print(f"gateway: {reply.get('error') or f'{args.key} had no state in zone {args.zone}'}", file=sys.stderr)
        return 1
    reply = await _admin(spec, "GET", path, allow=(404,))
    if "error" in reply:
        print(f"gateway: {reply['error']}", file=sys.stderr)
        return 1
    print(json.dumps(reply, indent=1))
    return 0


def _one_target(args: argparse.Namespace) -> str:
    if (args.target is None) == (args.file is None):
        raise ControlError(f"{args.command}: give either an IP address or CIDR, or --file PATH")
    try:
        return canonical_target(args.target)
    except ValueError as exc:
        raise ControlError(str(exc)) from None


async def _unban(args: argparse.Namespace, spec: ConfigSpec) -> int:
    target = _one_target(args)
    if spec.store.redis is not None:
        found = await _with_redis(spec, lambda bans: bans.remove(target))
    else:
        reply = await _admin(spec, "DELETE", "/bans/" + quote(target, safe=""), {}, allow=(404,))
        found = bool(reply.get("removed"))
    print(f"unbanned {target}" if found else f"{target} was not banned")
    return 0 if found else 1


async def _list(args: argparse.Namespace, spec: ConfigSpec) -> int:
    if args.limit < 1 or args.offset < 0:
        raise ControlError("bans: --limit must be 1 or more and --offset 0 or more")
    within = None
    if args.match:
        try:
            within = canonical_target(args.match)
        except ValueError as exc:
            raise ControlError(f"bans --match: {exc}") from None
    if spec.store.redis is not None:
        total, page = await _with_redis(
            spec,
            lambda bans: bans.select(within=within, reason=args.reason, offset=args.offset, limit=args.limit),
            LIST_BUDGET,  # reads the whole list (HSCAN, in chunks), each call bounded by the client's timeout
        )
        listed = [_view(b) for b in page]
    else:
        query = {"limit": str(min(args.limit, 100_000)), "offset": str(args.offset)}
        if within:
            query["match"] = within
        if args.reason is not None:
            query["reason"] = args.reason
        listed, headers = await _admin_with_headers(spec, "GET", "/bans?" + urlencode(query))
        total = int(headers.get("X-Total-Count", len(listed)))
    if args.json:
        print(json.dumps(listed, indent=1))
        return 0
    if not listed:
        print("no bans in force" if not total else f"{total} bans in force; none from offset {args.offset}")
        return 0
    print(f"{'TARGET':<40} {'REMAINING':>10}  REASON")
    for item in listed:
        remaining = "forever" if item["remaining_s"] is None else f"{item['remaining_s']}s"
        print(f"{item['target']:<40} {remaining:>10}  {item['reason']}")
    first = args.offset + 1
    print(f"{total} bans in force" + (f"; shown {first}-{first + len(listed) - 1}" if len(listed) < total else ""))
    return 0


async def _ban(args: argparse.Namespace, spec: ConfigSpec) -> int:
    target = _one_target(args)
    try:
        duration = parse_duration_ms(args.duration)
    except ValueError as exc:
        raise ControlError(str(exc)) from None
    refusal = ban_refusal(target, spec)
    if refusal is not None and not args.force:
        raise ControlError(f"ban refused: {refusal}; add --force to ban anyway")
    if spec.store.redis is not None:
        now = epoch_ms()
        ban = Ban(target, now + duration if duration else 0, args.reason, now, "cli")
        await _with_redis(spec, lambda bans: bans.add(ban))
    else:
        body = {"target": target, "for": args.duration, "reason": args.reason, "by": "cli", "force": args.force}
        await _admin(spec, "POST", "/bans", body)
    print(f"banned {target} " + (f"for {args.duration}" if duration else "until unbanned"))
    return 0


def _read_file(args: argparse.Namespace) -> Blocklist:
    if args.target is not None:
        raise ControlError(f"{args.command}: give either an IP address or CIDR, or --file PATH")
    try:
        return read_blocklist(args.file)
    except OSError as exc:
        raise ControlError(f"cannot read {args.file}: {exc.strerror or exc}") from None


def _report(path: str, problems: list[tuple[int, str]]) -> None:
    """One line per skipped line (the first MAX_ERRORS_SHOWN), then how many more."""
    name = "<stdin>" if path == "-" else path
    for number, problem in sorted(problems)[:MAX_ERRORS_SHOWN]:
        print(f"gateway: {name}:{number}: {_one_line(problem)}", file=sys.stderr)
    if len(problems) > MAX_ERRORS_SHOWN:
        print(f"gateway: {name}: {len(problems) - MAX_ERRORS_SHOWN} more lines skipped", file=sys.stderr)


async def _ban_file(args: argparse.Namespace, spec: ConfigSpec) -> int:
    blocklist = _read_file(args)
    try:
        duration = parse_duration_ms(args.duration)
    except ValueError as exc:
        raise ControlError(str(exc)) from None
    problems = list(blocklist.errors)
    if spec.store.redis is not None:
        policy = BanPolicy(spec)
        now = epoch_ms()
        until = now + duration if duration else 0
        bans = []
        for number, target in blocklist.targets:
            refusal = policy.refusal(target)
            if refusal is not None and not args.force:
                problems.append((number, f"ban refused: {refusal}; add --force to ban anyway"))
                continue
            bans.append(Ban(target, until, args.reason, now, "cli"))
        await _with_redis(spec, lambda store: store.add_many(bans), len(bans))
        applied = len(bans)
    else:
        applied = 0
        for start in range(0, len(blocklist.targets), ADMIN_CHUNK):
            chunk = blocklist.targets[start : start + ADMIN_CHUNK]
            body = {
                "bans": [target for _, target in chunk],
                "for": args.duration,
                "reason": args.reason,
                "by": "cli",
                "force": args.force,
            }
            reply = await _admin(spec, "POST", "/bans", body)
            for item in reply.get("refused", []):
                problems.append((chunk[item["index"]][0], f"ban refused by the gateway: {item['reason']}; add --force"))
            for item in reply.get("invalid", []):
                problems.append((chunk[item["index"]][0], str(item["error"])))
            applied += int(reply.get("banned", 0))
    _report(args.file, problems)
    span = f"for {args.duration}" if duration else "until unbanned"
    print(f"banned {applied} addresses and networks {span}" + (f"; {len(problems)} lines skipped" if problems else ""))
    return 1 if problems else 0


async def _unban_file(args: argparse.Namespace, spec: ConfigSpec) -> int:
    blocklist = _read_file(args)
    targets = [target for _, target in blocklist.targets]
    if spec.store.redis is not None:
        found = len(await _with_redis(spec, lambda bans: bans.remove_many(targets), len(targets)))
    else:
        found = 0
        for start in range(0, len(targets), ADMIN_CHUNK):
            reply = await _admin(spec, "POST", "/bans/remove", {"targets": targets[start : start + ADMIN_CHUNK]})
            found += int(reply.get("removed", 0))
    _report(args.file, blocklist.errors)
    print(f"unbanned {found}; {len(targets) - found} were not banned" + _skipped(blocklist.errors))
    return 1 if blocklist.errors else 0


def _skipped(problems: list[tuple[int, str]]) -> str:
    return f"; {len(problems)} lines skipped" if problems else ""


def _view(ban: Ban) -> dict[str, Any]:
    from gateway.admin.bans import ban_view

    return ban_view(ban)


async def _with_redis(spec: ConfigSpec, action: Callable[[RedisBans], Awaitable[T]], entries: int = 0) -> T:
    """Run ``action`` on the shared ban list, bounded in time; any Redis failure is a ControlError."""
    from gateway.store.redis import connect

    redis_spec = spec.store.redis
    assert redis_spec is not None
    client = connect(redis_spec, max(2.0, redis_spec.timeout_ms / 1000))
    bans = RedisBans(client, redis_spec.prefix.encode(), BanList(), sync_interval_s=3600)
    try:
        return await asyncio.wait_for(action(bans), REDIS_TIMEOUT_S + entries / 10_000 * REDIS_TIMEOUT_S)
    except Exception as exc:
        detail = "no answer in time" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        raise ControlError(f"cannot reach Redis (store.redis): {detail}") from None
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.aclose(), 1.0)


def _token(spec: ConfigSpec) -> str:
    if spec.admin.token is not None:
        return spec.admin.token
    assert spec.admin.listen is not None
    path = admin_token.token_path(spec.admin.token_file, spec.admin.listen[1])
    try:
        return admin_token.read(path)
    except admin_token.TokenFileError as exc:
        raise ControlError(
            f"no admin token: admin.token is not set and the token file cannot be used ({exc}); "
            "is the gateway running, as this user?"
        ) from None


async def _admin(spec: ConfigSpec, method: str, path: str, body: Any = None, allow: tuple[int, ...] = ()) -> Any:
    return (await _admin_with_headers(spec, method, path, body, allow))[0]


async def _admin_with_headers(
    spec: ConfigSpec, method: str, path: str, body: Any = None, allow: tuple[int, ...] = ()
) -> tuple[Any, dict[str, str]]:
    if spec.admin.listen is None:
        raise ControlError("the admin API is off (admin.listen) and there is no Redis store to act on")
    host, port = spec.admin.listen
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    headers = {"Authorization": f"Bearer {_token(spec)}"}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body)
    url = f"http://{host if ':' not in host else '[' + host + ']'}:{port}{path}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ADMIN_TIMEOUT_S)) as session:
            async with session.request(method, url, data=data, headers=headers) as resp:
                text = await resp.text(errors="replace")
                status = resp.status
                headers = dict(resp.headers)
    except (aiohttp.ClientError, TimeoutError) as exc:
        detail = "no answer in time" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
        raise ControlError(f"cannot reach the admin API at {host}:{port} ({detail}); is the gateway running?") from None
    try:
        reply = json.loads(text)
    except ValueError:
        reply = None
    if status >= 400 and status not in allow and not (path == "/reload" and status == 400):
        error = reply.get("error") if isinstance(reply, dict) else None
        message = str(error) if error else text.strip()[:200]
        if status == 409:
            reason = reply.get("reason") if isinstance(reply, dict) else None
            raise ControlError(f"ban refused by the gateway: {reason or message}; add --force to ban anyway")
        raise ControlError(f"admin API answered {status}: {message}")
    if reply is None:
        raise ControlError(f"admin API answered {status} with a body that is not JSON")
    return reply, headers


def _one_line(text: str) -> str:
    return " ".join(text.split())
