"""GCRA, as redis-cell's ``CL.THROTTLE <key> <max_burst> <count> <period> [<quantity>]``.

State per key: the theoretical arrival time (TAT) in ns. With the emission interval
``T = trunc(period_ns / count)`` (computed in float64, as redis-cell does),
``tau = T * (burst + 1)`` and ``increment = T * quantity``:

* ``new_tat = max(now, tat) + increment``; the request is limited when
  ``new_tat - tau > now`` (nothing is written then);
* the reply is redis-cell's five integers: limited, limit (burst + 1), remaining,
  retry_after and reset_after in seconds, each rounded up when its sub-second part
  is at least 1 ms, ``retry_after`` -1 when allowed (or when the request is larger
  than the whole capacity and can never pass).

A TAT at or before ``now`` is the same as no state (the Redis key would have expired).
The clock is injected: ``now`` is ns.

``ZONE_TYPE`` at the end is the zone type's record (``gateway.limits.algo``): what the stores,
the plan and the inspect readers use. Its Redis script is ``scripts/lua/gcra.lua``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.limits.algo import AlgoType
from gateway.limits.outcome import AlgoOutcome

if TYPE_CHECKING:
    from gateway.config.zones import ZoneSpec

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
MAX_SPAN_NS = 2**53  # tau at most this: the Lua script's doubles stay exact to the ns


@dataclass(frozen=True, slots=True)
class GcraParams:
    burst: int  # redis-cell's max_burst
    count: int  # requests per period
    period_s: int

    @property
    def emission_ns(self) -> int:
        return int(self.period_s * 1e9 / self.count)

    @property
    def tau_ns(self) -> int:
        return self.emission_ns * (self.burst + 1)

    @property
    def limit(self) -> int:
        return self.burst + 1

    def clamp_quantity(self, quantity: int) -> int:
        """Any quantity above the capacity gets the same answer; keep the arithmetic small."""
        return min(quantity, self.burst + 2)


@dataclass(frozen=True, slots=True)
class GcraStep:
    limited: bool
    limit: int
    remaining: int
    retry_after_s: int  # -1 when allowed or when the request can never pass
    reset_after_s: int
    new_tat: int | None  # the state to store (None: leave the key as it is)
    ttl_ms: int  # the key's PEXPIRE when new_tat is stored


def to_seconds(ns: int) -> int:
    """redis-cell's conversion: whole seconds, plus one when at least 1 ms is left over."""
    whole, rest = divmod(ns, NS_PER_S)
    return whole + 1 if rest >= NS_PER_MS else whole


def _trunc_div(a: int, b: int) -> int:
    """Integer division rounding towards zero (Rust's and chrono's)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def throttle(tat: int | None, now: int, params: GcraParams, quantity: int = 1) -> GcraStep:
    """Decide one request of ``quantity`` units without changing anything."""
    emission = params.emission_ns
    tau = emission * (params.burst + 1)
    increment = emission * params.clamp_quantity(quantity)
    if tat is None or tat < now:
        tat = now
    new_tat = tat + increment
    diff = now - (new_tat - tau)
    if diff < 0:
        retry = -diff if increment <= tau else -1
        ttl = tat - now
        stored: int | None = None
    else:
        retry = -1
        ttl = new_tat - now
        stored = new_tat if increment else None
    nxt = tau - ttl
    remaining = 0
    if nxt > -emission:
        remaining = int(_trunc_div(nxt, 1000) / _trunc_div(emission, 1000))
    return GcraStep(
        limited=diff < 0,
        limit=params.limit,
        remaining=remaining,
        retry_after_s=to_seconds(retry) if retry >= 0 else -1,
        reset_after_s=to_seconds(ttl),
        new_tat=stored,
        ttl_ms=max(1, (new_tat - now) // NS_PER_MS),
    )


def expired(tat: int, now: int) -> bool:
    return tat <= now


# -- the zone type's record ---------------------------------------------------------------------


def _params_of(zone: ZoneSpec) -> GcraParams:
    rate = zone.period_rate
    assert rate is not None
    return GcraParams(burst=zone.burst, count=rate.count, period_s=rate.period_s)


def _decide(params: GcraParams, state: int | None, now_ms: int, cost: int) -> tuple[AlgoOutcome, int | None]:
    step = throttle(state, now_ms * NS_PER_MS, params, cost)
    outcome = AlgoOutcome(not step.limited, step.limit, step.remaining, step.retry_after_s, step.reset_after_s)
    return outcome, (step.new_tat if not step.limited else None)


def _expired(params: GcraParams, state: int, now_ms: int) -> bool:
    return expired(state, now_ms * NS_PER_MS)


def _policy(zone: str, p: GcraParams) -> str:
    return f'"{zone}";q={p.limit};w={p.period_s * p.limit // p.count or 1}'


def _lua_args(p: GcraParams) -> list[Any]:
    return [p.emission_ns, p.burst, 0]


def _undo(p: GcraParams, cost: int, now_ms: int, fields: list[Any]) -> str:
    return f"g{p.emission_ns * cost}:{now_ms}"  # TAT - increment, not below now


def _view(params: GcraParams, state: int, now_ms: int) -> dict[str, Any]:
    return {"tat_in_ms": max(0, (state - now_ms * NS_PER_MS) // NS_PER_MS)}


def _clamp(params: GcraParams, cost: int) -> int:
    return params.clamp_quantity(cost)


ZONE_TYPE = AlgoType(
    name="gcra",
    code=1,
    script="gcra.lua",
    params=GcraParams,
    params_of=_params_of,
    decide=_decide,
    expired=_expired,
    policy=_policy,
    lua_args=_lua_args,
    undo=_undo,
    undo_tag="g",
    view=_view,
    tagged=False,  # untagged like limit_req's: the key CL.THROTTLE would use
    clamp=_clamp,
)
