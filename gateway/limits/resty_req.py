"""lua-resty-redis-ratelimit's leaky bucket, the model that scripts/lua/limit_req.lua implements.

It differs from nginx's integer rules (``nginx_req``) on purpose, for compatibility
with OpenResty nodes sharing the same keys:

* floating-point milli-requests; the leak uses ``|now - last|`` and is not truncated;
* ``last`` is always set to ``now`` on an accepted request;
* the stored excess keeps 14 significant digits (cjson), the reply is truncated;
* state expires 60 s after the last accepted request (Redis TTL), so a key idle
  for a minute starts again from 0 even at slow rates like 1r/m;
* a ban (``duration`` s) is part of the state: ``[excess, now, 1]`` until it expires.

The delay (``delay_ms``) is the one a lua-resty-redis-ratelimit node waits, not nginx's.
What the library (v0.03, ``lib/resty/redis/ratelimit.lua``) does, in words:

* it stores ``excess`` in milli-requests as a float (1000 = one request waiting), never
  truncated: cjson writes it with 14 significant digits;
* the script replies ``{state, excess}`` with the float excess, and Redis turns a Lua number
  in a reply into an integer by truncation (a C cast), so the node receives ``trunc(excess)``;
* ``incoming`` returns ``delay = excess / rate_m`` in seconds (the truncated integer divided by
  the integer ``rate_m = floor(N*1000/scale)``, in double precision); the caller passes it to
  ``ngx.sleep``, which waits ``(ngx_int_t) (seconds * 1000)`` ms: truncated again (the README's
  ``if delay >= 0.001`` only skips sleeps that truncate to 0 ms anyway).

So a node waits ``trunc(trunc(excess) / rate_m * 1000)`` ms, in double arithmetic. That is not
always ``trunc(excess) * 1000 // rate_m``: at 3r/m (rate_m 50) an excess of 201 gives
201 / 50 = 4.0199999999999996 s, 4019 ms where the exact quotient is 4020. nginx's integer
rule (``nginx_req.delay_of``) stays the embedded store's.

Pure functions, no I/O: used to check the Lua scripts (tests/redis/test_lua_scripts.py,
tests/redis/test_resty_delay.py) and the interop grid with an OpenResty node.
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


def delay_ms(excess: int, rate_m: int, delay_m: int = 0) -> int:
    """The ms a lua-resty-redis-ratelimit node waits for a request the script accepted with the
    reply ``excess`` (already truncated by Redis), as request.lua computes it.

    ``delay_m`` is the gateway's ``delay=`` threshold (not in the library; 0 by default, so the
    result is the library's): the excess above it is divided the same way. In double arithmetic,
    as in Lua: ``trunc((excess - delay_m) / rate_m * 1000)``.
    """
    if excess <= delay_m:
        return 0
    return int(float(excess - delay_m) / float(rate_m) * 1000.0)
