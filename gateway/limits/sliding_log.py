"""An exact sliding window: the times of the requests a key made in the last ``window``.

A request at ``now`` passes when fewer than ``limit`` logged requests fall in
``(now - window, now]``; it is then logged. A rejected request is not logged, so a
key never holds more than ``limit`` entries. Older entries are dropped as they
slide out.

The answer for the RateLimit headers: ``remaining`` is ``limit`` minus the entries
in the window (this one included); ``reset_ms`` is when the newest entry slides out
(the whole quota is back); when rejected, ``retry_ms`` is when the oldest one does.

State per key: a sorted tuple of ms timestamps. The clock is injected: ``now`` is ms.

``ZONE_TYPE`` at the end is the zone type's record (``gateway.limits.algo``): what the stores,
the plan and the inspect readers use. Its Redis script is ``scripts/lua/sliding_log.lua``.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.limits.algo import AlgoType
from gateway.limits.outcome import AlgoOutcome

if TYPE_CHECKING:
    from gateway.config.zones import ZoneSpec

# One entry of a log in the embedded store: a tuple slot (8 bytes) and an int object (32 bytes).
# A key is charged for a full log up front, so a zone's ``size`` stays a bound whatever the logs hold.
LOG_ENTRY_COST = 40


@dataclass(frozen=True, slots=True)
class LogParams:
    limit: int
    window_ms: int


@dataclass(frozen=True, slots=True)
class LogStep:
    allowed: bool
    remaining: int
    retry_ms: int  # when rejected: until the oldest entry slides out (0 when allowed)
    reset_ms: int  # until the newest entry slides out
    state: tuple[int, ...]  # the log to store if the request is committed


def live(log: tuple[int, ...], now: int, window_ms: int) -> tuple[int, ...]:
    """The entries still inside ``(now - window, now]``."""
    start = bisect_right(log, now - window_ms)
    return log[start:] if start else log


def check(log: tuple[int, ...] | None, now: int, params: LogParams) -> LogStep:
    """Decide one request for one key without changing anything."""
    entries = live(log or (), now, params.window_ms)
    if len(entries) >= params.limit:
        return LogStep(
            allowed=False,
            remaining=0,
            retry_ms=entries[0] + params.window_ms - now,
            reset_ms=entries[-1] + params.window_ms - now,
            state=entries,
        )
    entries = (*entries, now) if not entries or entries[-1] <= now else tuple(sorted((*entries, now)))
    return LogStep(
        allowed=True,
        remaining=params.limit - len(entries),
        retry_ms=0,
        reset_ms=params.window_ms,
        state=entries,
    )


def expired(log: tuple[int, ...], now: int, window_ms: int) -> bool:
    return not log or log[-1] <= now - window_ms


# -- the zone type's record ---------------------------------------------------------------------


def _params_of(zone: ZoneSpec) -> LogParams:
    return LogParams(limit=zone.limit, window_ms=zone.window_ms)


def _decide(params: LogParams, state: tuple[int, ...] | None, now_ms: int, cost: int) -> tuple[AlgoOutcome, Any]:
    log = check(state, now_ms, params)
    retry = -(-log.retry_ms // 1000) if not log.allowed else -1
    outcome = AlgoOutcome(log.allowed, params.limit, log.remaining, retry, -(-log.reset_ms // 1000))
    return outcome, (log.state if log.allowed else None)


def _expired(params: LogParams, state: tuple[int, ...], now_ms: int) -> bool:
    return expired(state, now_ms, params.window_ms)


def _policy(zone: str, p: LogParams) -> str:
    return f'"{zone}";q={p.limit};w={-(-p.window_ms // 1000)}'


def _lua_args(p: LogParams) -> list[Any]:
    return [p.limit, p.window_ms, 0]


def _undo(p: LogParams, cost: int, now_ms: int, fields: list[Any]) -> str:
    return "n"  # remove the request's member, like a conn lease


def _view(params: LogParams, state: tuple[int, ...], now_ms: int) -> dict[str, Any]:
    in_window = len([t for t in state if t > now_ms - params.window_ms])
    return {"in_window": in_window, "remaining": max(0, params.limit - in_window)}


async def _redis_view(client: Any, key: bytes, params: LogParams, now_ms: int) -> dict[str, Any] | None:
    in_window = int(await client.zcount(key, f"({now_ms - params.window_ms}", "+inf"))
    return {"in_window": in_window, "remaining": max(0, params.limit - in_window)} if in_window else None


def _extra_bytes(params: LogParams) -> int:
    return LOG_ENTRY_COST * params.limit


ZONE_TYPE = AlgoType(
    name="sliding_log",
    code=2,
    script="sliding_log.lua",
    params=LogParams,
    params_of=_params_of,
    decide=_decide,
    expired=_expired,
    policy=_policy,
    lua_args=_lua_args,
    undo=_undo,
    view=_view,
    redis_view=_redis_view,
    extra_bytes=_extra_bytes,
)
