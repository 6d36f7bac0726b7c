"""count zones with ``window_type: sliding``: APISIX limit-count's sliding estimate (reference §7.2).

Windows are aligned to the clock (the fake clock's T0 is a multiple of 10 s, so the
vectors' windows start at t = 0, 10000, ...). The store reports APISIX's remaining as
``used = limit - remaining`` and its reset (rounded up to 10 ms) as ``count_reset_ms``.
"""

from __future__ import annotations

from gateway.limits import sliding_count
from gateway.limits.params import CountParams
from tests.support.conformance import Scenario, config


def sliding_config(limit: int, window: str, use: str = "limit_count") -> str:
    return config(
        f"  quota: {{type: count, key: $arg_k, limit: {limit}, window: {window}, window_type: sliding}}",
        f"  - {{location: /, upstream: app, {use}: [{{zone: quota}}]}}",
    )


async def _answer(s: Scenario, t: int) -> tuple[str, int, int]:
    """(status, APISIX remaining, reset ms) of one request."""
    outcome = await s.hit("/", t)
    return outcome.count, 10 - outcome.verdict.count_used[0], outcome.verdict.count_reset_ms[0]


async def test_apisix_estimate_remaining_and_reset(store, clock):
    s = Scenario(store, clock, sliding_config(10, "10s"))
    first = [await _answer(s, 1000) for _ in range(11)]
    assert first[:10] == [("PASSED", 9 - i, 9000) for i in range(10)]
    assert first[10] == ("REJECTED", 0, 9000)  # the current window is full: reset = its end
    # 5 s into the next window the previous window weighs 10 * 5000/10000 = 5
    assert [await _answer(s, 15000) for _ in range(6)] == [
        ("PASSED", 4, 5000),
        ("PASSED", 3, 5000),
        ("PASSED", 2, 5000),
        ("PASSED", 1, 5000),
        ("PASSED", 0, 5000),
        ("REJECTED", 0, 0),  # 5000 - (10 - 5) * 10000 / 10 = 0
    ]
    assert await _answer(s, 16000) == ("PASSED", 0, 4000)  # 4 + 5 < 10, remaining floor(10 - 6 - 4)
    assert await _answer(s, 16000) == ("REJECTED", 0, 0)
    # 3.999 + 6 < 10 passes; APISIX's remaining is then floor(-0.999) = -1 (reported as 0)
    assert await _answer(s, 16001) == ("PASSED", 0, 4000)
    assert await _answer(s, 16500) == ("REJECTED", 0, 500)  # 3500 - 3 * 1000
    assert await _answer(s, 16777) == ("REJECTED", 0, 230)  # 223 ms, rounded up to 10 ms
    assert await _answer(s, 25000) == ("PASSED", 5, 5000)  # previous window held 7: 10 - 1 - 3.5
    assert await _answer(s, 40000) == ("PASSED", 9, 10000)  # two windows later: nothing left


async def test_no_double_burst_across_a_window_boundary(store, clock):
    # the fixed window's weakness: limit at the end of one window and again at the start of the next
    s = Scenario(store, clock, sliding_config(10, "10s", use="limits"))
    assert [(await s.hit("/", 9999)).count for _ in range(10)] == ["PASSED"] * 10
    # a fixed window would pass 10 more at t=10000; the estimate lets the old ones slide out
    assert [(await s.hit("/", 10000)).count for _ in range(3)] == ["REJECTED"] * 3  # 10 * 10000/10000 >= 10
    assert [(await s.hit("/", 10001)).count for _ in range(3)] == ["PASSED", "REJECTED", "REJECTED"]
    assert [(await s.hit("/", 11001)).count for _ in range(3)] == ["PASSED", "REJECTED", "REJECTED"]


def test_pure_remaining_can_be_minus_one_like_apisix():
    params = CountParams("z", limit=10, window_ms=10_000, sliding=True)
    state = sliding_count.pack(0, 10, 0)
    for _ in range(5):
        state = sliding_count.check(state, 15000, params).state
    state = sliding_count.check(state, 16000, params).state
    step = sliding_count.check(state, 16001, params)
    assert (step.allowed, step.remaining) == (True, -1)
