"""The sliding window counter: APISIX limit-count's ``window_type: sliding`` estimate.

Windows are aligned to the clock (window id ``now // W``); a key keeps the count of
its current window and of the one before. With ``rem = W - now % W`` (ms left in
the current window) and ``last = min(previous count, limit)``, the estimate of the
last W ms is ``last / W * rem + current``:

* rejected (nothing counted) when ``current >= limit`` or the estimate ``>= limit``;
  ``reset`` is ``rem`` when the current window is full, otherwise the time until the
  previous window's share has slid out far enough: ``rem - (limit - current) / (last / W)``
  (``rem`` when ``last`` is 0), at least 0;
* otherwise ``current + 1``, ``remaining = floor(limit - current - last / W * rem)``
  and ``reset = rem``.

Every reset is rounded up to 10 ms, as APISIX rounds seconds up to 2 decimals.
The arithmetic is integer (ms), so the comparisons are exact where APISIX's floats
may round. The clock is injected: ``now`` is ms.

State per key: ``(window id, current, previous)``, packed into one int by ``pack``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.limits.params import CountParams

_COUNT_BITS = 32
_COUNT_MASK = (1 << _COUNT_BITS) - 1
MAX_PRODUCT = 2**53  # limit * window_ms at most this: the Lua script's doubles stay exact


def pack(window_id: int, current: int, previous: int) -> int:
    return current | (previous << _COUNT_BITS) | (window_id << (2 * _COUNT_BITS))


def unpack(state: int) -> tuple[int, int, int]:
    return state >> (2 * _COUNT_BITS), state & _COUNT_MASK, (state >> _COUNT_BITS) & _COUNT_MASK


@dataclass(frozen=True, slots=True)
class SlidingStep:
    allowed: bool
    remaining: int  # APISIX's remaining (may be -1 just after the estimate crosses the limit)
    reset_ms: int  # rounded up to 10 ms
    state: int  # the state to store if the request is committed


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def counts(state: int | None, now: int, window_ms: int) -> tuple[int, int, int]:
    """(window id, current, previous) as seen at ``now``."""
    window_id = now // window_ms
    if state is None:
        return window_id, 0, 0
    stored_id, current, previous = unpack(state)
    if stored_id == window_id:
        return window_id, current, previous
    if stored_id == window_id - 1:
        return window_id, 0, current
    return window_id, 0, 0


def check(state: int | None, now: int, params: CountParams) -> SlidingStep:
    """Decide one request for one key without changing anything."""
    w, limit = params.window_ms, params.limit
    window_id, current, previous = counts(state, now, w)
    rem = w - now % w
    last = min(previous, limit)
    unchanged = pack(window_id, current, previous)
    if current >= limit:
        return SlidingStep(False, 0, _ceil_div(rem, 10) * 10, unchanged)
    if last * rem + current * w >= limit * w:
        if last == 0:
            reset = _ceil_div(rem, 10) * 10
        else:
            # rem - (limit - current) * w / last, rounded up to 10 ms
            reset = max(0, _ceil_div(rem * last - (limit - current) * w, 10 * last) * 10)
        return SlidingStep(False, 0, reset, unchanged)
    current += 1
    remaining = ((limit - current) * w - last * rem) // w
    return SlidingStep(True, remaining, _ceil_div(rem, 10) * 10, pack(window_id, current, previous))


def expired(state: int, now: int, window_ms: int) -> bool:
    return unpack(state)[0] < now // window_ms - 1
