"""An exact sliding window: the times of the requests a key made in the last ``window``.

A request at ``now`` passes when fewer than ``limit`` logged requests fall in
``(now - window, now]``; it is then logged. A rejected request is not logged, so a
key never holds more than ``limit`` entries. Older entries are dropped as they
slide out.

The answer for the RateLimit headers: ``remaining`` is ``limit`` minus the entries
in the window (this one included); ``reset_ms`` is when the newest entry slides out
(the whole quota is back); when rejected, ``retry_ms`` is when the oldest one does.

State per key: a sorted tuple of ms timestamps. The clock is injected: ``now`` is ms.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass


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
