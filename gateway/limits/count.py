"""Fixed-window request counting, like OpenResty's ``resty.limit.count``.

A key's window starts at its first request and lasts ``window`` ms (it is not
aligned to the clock). Within it at most ``limit`` requests pass. After each
decision the caller learns ``remaining`` (limit - used) and ``reset`` (ms until
the window ends), for the RateLimit headers.

One difference from resty.limit.count, on purpose: a rejected request is not
counted (resty keeps decrementing below zero), so several count zones on one
route behave like several limit_req zones: a request rejected by one zone is
charged to none. What a client observes from a single zone is identical.

State per key: ``(used, window_end_ms)``, packed into one int by the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.limits.params import CountParams

_USED_BITS = 32
_USED_MASK = (1 << _USED_BITS) - 1


def pack(used: int, window_end: int) -> int:
    return used | (window_end << _USED_BITS)


def unpack(state: int) -> tuple[int, int]:
    return state & _USED_MASK, state >> _USED_BITS


@dataclass(frozen=True, slots=True)
class CountStep:
    allowed: bool
    used: int  # after this request (unchanged when rejected)
    reset_ms: int  # until the window ends
    state: int  # the state to store if the request is committed


def check(state: int | None, now: int, params: CountParams) -> CountStep:
    """Decide one request for one key without changing anything."""
    if state is not None:
        used, window_end = unpack(state)
        if now >= window_end:
            state = None
    if state is None:
        used, window_end = 0, now + params.window_ms
    if used + 1 > params.limit:
        return CountStep(False, used, window_end - now, pack(used, window_end))
    return CountStep(True, used + 1, window_end - now, pack(used + 1, window_end))


def expired(state: int, now: int) -> bool:
    return now >= unpack(state)[1]
