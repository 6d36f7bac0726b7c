"""A token bucket that makes requests wait: Guava's ``SmoothBursty`` and ``SmoothWarmingUp``.

Written from the formulas documented in Guava's ``SmoothRateLimiter`` (not its code).
State per key: ``stored`` permits (a float) and ``next_free`` (µs), the time the next
request may go. Times are µs as floats, Guava's doubles; every step below is done
in the same order in ``scripts/lua/token.lua``, so both stores compute the same bits.

* **resync**: time after ``next_free`` refills ``stored`` at one permit per
  cool-down interval, up to ``max_permits``; ``next_free`` moves to now.
* **a request** takes its permit now and pays for it *later*: it waits until the
  current ``next_free`` (the first request of a fresh key waits for nothing), and
  pushes ``next_free`` by the cost of its permit: a stored permit costs
  ``stored_wait`` (0 for SmoothBursty), a fresh one the stable interval ``1/rate``.
* **max_delay**: a request that would wait longer than ``max_delay`` is rejected
  and takes nothing (Guava's ``tryAcquire(permits, timeout)``).

SmoothBursty: ``max_permits = rate x 1 s``, refill at the stable interval, a new key
starts full (Guava's new limiter starts empty: see ``fresh``). SmoothWarmingUp
(``warmup``, cold factor 3): with stable interval S and cold interval C = 3 S,
``threshold = 0.5 x warmup / S`` and ``max_permits =
threshold + 2 x warmup / (S + C)``; a stored permit above the threshold costs the
area under the line from S (at the threshold) to C (at max_permits); refill takes
``warmup / max_permits`` per permit, so an idle key goes back to cold in ``warmup``;
a new key starts cold (full). With rate 5/s and warmup 3 s: threshold 7.5, max 15,
the first requests are spaced ~0.57 s, then ~0.2 s after about 3 s of demand.

``ZONE_TYPE`` at the end is the zone type's record (``gateway.limits.algo``): what the stores,
the plan and the inspect readers use. Its Redis script is ``scripts/lua/token.lua``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.limits.algo import AlgoType, text_of
from gateway.limits.outcome import AlgoOutcome

if TYPE_CHECKING:
    from gateway.config.zones import ZoneSpec

COLD_FACTOR = 3.0


@dataclass(frozen=True, slots=True)
class TokenParams:
    stable_us: float  # 1e6 / permits per second
    warmup_us: float  # 0: SmoothBursty
    max_delay_us: float
    count: int = 0  # N of "N r/period": the quota the RateLimit headers report
    period_s: int = 1

    @classmethod
    def of(cls, count: int, period_s: int, warmup_ms: int, max_delay_ms: int) -> TokenParams:
        return cls(period_s * 1e6 / count, warmup_ms * 1000.0, max_delay_ms * 1000.0, count, period_s)

    @property
    def cold_us(self) -> float:
        return self.stable_us * COLD_FACTOR

    @property
    def threshold(self) -> float:
        return 0.5 * self.warmup_us / self.stable_us if self.warmup_us else 0.0

    @property
    def max_permits(self) -> float:
        if not self.warmup_us:
            return 1e6 / self.stable_us  # SmoothBursty: one second of permits
        return self.threshold + 2.0 * self.warmup_us / (self.stable_us + self.cold_us)

    @property
    def slope(self) -> float:
        return (self.cold_us - self.stable_us) / (self.max_permits - self.threshold)

    @property
    def cool_down_us(self) -> float:
        return self.warmup_us / self.max_permits if self.warmup_us else self.stable_us

    def fresh(self, now_us: float) -> tuple[float, float]:
        """A key's first state: full, as if it had been idle forever (cold, with a warm-up).

        Guava starts a new SmoothBursty limiter empty; a key never seen here is the same
        as a key idle for long, so that an idle key's state can be dropped (evicted, or
        expired in Redis) without changing any answer.
        """
        return self.max_permits, now_us


@dataclass(frozen=True, slots=True)
class TokenStep:
    allowed: bool
    wait_us: float  # how long this request waits for its permit (0 when rejected)
    retry_us: float  # when rejected: until it would be within max_delay
    stored: float  # permits stored after this request (as it would be stored)
    state: tuple[float, float]  # (stored, next_free) to store if the request is committed


def _permits_to_time(params: TokenParams, permits: float) -> float:
    return params.stable_us + permits * params.slope


def stored_wait(params: TokenParams, stored: float, take: float) -> float:
    """µs that taking ``take`` of ``stored`` permits costs (truncated like Guava's long)."""
    micros = 0.0
    if params.warmup_us:
        above = stored - params.threshold
        if above > 0.0:
            above_take = min(above, take)
            length = _permits_to_time(params, above) + _permits_to_time(params, above - above_take)
            micros = float(math.trunc(above_take * length / 2.0))
            take -= above_take
        return micros + float(math.trunc(params.stable_us * take))
    return 0.0


def resync(params: TokenParams, state: tuple[float, float] | None, now_us: float) -> tuple[float, float]:
    if state is None:
        return params.fresh(now_us)
    stored, next_free = state
    if now_us > next_free:
        stored = min(params.max_permits, stored + (now_us - next_free) / params.cool_down_us)
        next_free = now_us
    return stored, next_free


def acquire(state: tuple[float, float] | None, now_us: float, params: TokenParams, permits: int = 1) -> TokenStep:
    """Decide one request without changing anything."""
    if state is not None and state[1] - params.max_delay_us > now_us:
        return TokenStep(False, 0.0, state[1] - params.max_delay_us - now_us, resync(params, state, now_us)[0], state)
    stored, next_free = resync(params, state, now_us)
    spend = min(float(permits), stored)
    fresh = permits - spend
    wait = stored_wait(params, stored, spend) + float(math.trunc(fresh * params.stable_us))
    return TokenStep(
        allowed=True,
        wait_us=max(next_free - now_us, 0.0),
        retry_us=0.0,
        stored=stored - spend,
        state=(stored - spend, next_free + wait),
    )


def outcome_fields(step: TokenStep, now_us: float, params: TokenParams) -> tuple[int, int, int, int]:
    """(remaining, retry_after_s, reset_s, delay_ms) for the RateLimit headers and the delay.

    remaining: whole permits stored; reset: until the bucket is full again; retry_after:
    until a request would wait no more than max_delay (-1 when allowed); delay: rounded up to 1 ms.
    """
    stored, next_free = step.state
    refill = max(next_free - now_us, 0.0) + max(params.max_permits - stored, 0.0) * params.cool_down_us
    retry = max(1, math.ceil(step.retry_us / 1e6)) if not step.allowed else -1
    return max(0, math.floor(step.stored)), retry, math.ceil(refill / 1e6), math.ceil(step.wait_us / 1000)


def expired(state: tuple[float, float], now_us: float, params: TokenParams) -> bool:
    """Whether a key's state is the same as none: it refilled to a new key's state."""
    return resync(params, state, now_us)[0] >= params.max_permits


# -- the zone type's record ---------------------------------------------------------------------


def _params_of(zone: ZoneSpec) -> TokenParams:
    rate = zone.period_rate
    assert rate is not None
    return TokenParams.of(rate.count, rate.period_s, zone.warmup_ms, zone.max_delay_ms)


def _decide(params: TokenParams, state: tuple[float, float] | None, now_ms: int, cost: int) -> tuple[AlgoOutcome, Any]:
    now_us = now_ms * 1000.0
    grant = acquire(state, now_us, params)
    remaining, retry_s, reset_s, delay_ms = outcome_fields(grant, now_us, params)
    outcome = AlgoOutcome(grant.allowed, params.count, remaining, retry_s, reset_s, delay_ms)
    return outcome, (grant.state if grant.allowed else None)


def _expired(params: TokenParams, state: tuple[float, float], now_ms: int) -> bool:
    return expired(state, now_ms * 1000.0, params)


def _policy(zone: str, p: TokenParams) -> str:
    return f'"{zone}";q={p.count};w={p.period_s}'


def _lua_args(p: TokenParams) -> list[Any]:
    return [p.stable_us, p.warmup_us, p.max_delay_us]


def _undo(p: TokenParams, cost: int, now_ms: int, fields: list[Any]) -> str:
    return f"t{text_of(fields[6])}|{text_of(fields[7])}"  # the value before, if it still holds ours


def _view(params: TokenParams, state: tuple[float, float], now_ms: int) -> dict[str, Any]:
    stored, next_free_us = state
    return {"stored_permits": stored, "next_free_in_ms": max(0.0, (next_free_us - now_ms * 1000.0) / 1000)}


def _quota(params: TokenParams) -> int:
    return params.count  # token.lua answers 0: the gateway knows the rate


ZONE_TYPE = AlgoType(
    name="token",
    code=3,
    script="token.lua",
    params=TokenParams,
    params_of=_params_of,
    decide=_decide,
    expired=_expired,
    policy=_policy,
    lua_args=_lua_args,
    undo=_undo,
    undo_tag="t",
    view=_view,
    quota=_quota,
)
