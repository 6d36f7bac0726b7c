"""lua-resty-redis-ratelimit's leaky bucket, the model that scripts/lua/limit_req.lua implements.

It differs from nginx's integer rules (``nginx_req``) on purpose, for compatibility
with OpenResty nodes sharing the same keys:

* floating-point milli-requests; the leak uses ``|now - last|`` and is not truncated;
* ``last`` is always set to ``now`` on an accepted request;
* the stored excess keeps 14 significant digits (cjson), the reply is truncated;
* state expires 60 s after the last accepted request (Redis TTL), so a key idle
  for a minute starts again from 0 even at slow rates like 1r/m;
* a ban (``duration`` s) is part of the state: ``[excess, now, 1]`` until it expires.

Pure functions, no I/O: used to check the Lua script (tests/test_lua_scripts.py).
"""

from __future__ import annotations

from dataclasses import dataclass

OK = 1
BUSY = 2
FORBIDDEN = 3


@dataclass(frozen=True, slots=True)
class State:
    excess: float
    last: float
    forbidden: int = 0


def cjson_number(value: float) -> float:
    """A number as Redis' cjson writes and reads it back (14 significant digits)."""
    return float(f"{value:.14g}")


def step(
    state: State | None, rate_m: int, burst_m: float, now: float, duration: int
) -> tuple[int, float, State | None, int | None]:
    """One call of the script: (reply state, excess, state to store or None, TTL seconds or None)."""
    if state is not None and state.forbidden == 1:
        return FORBIDDEN, state.excess, None, None
    excess = 0.0
    if state is not None:
        excess = max(0.0, state.excess - rate_m * abs(now - state.last) / 1000 + 1000)
    if excess > burst_m:
        if duration > 0:
            return BUSY, excess, State(cjson_number(excess), cjson_number(now), 1), duration
        return BUSY, excess, None, None
    return OK, excess, State(cjson_number(excess), cjson_number(now), 0), 60


def reply_integer(value: float) -> int:
    """Redis converts a Lua number in a reply to an integer by truncation."""
    return int(value)
