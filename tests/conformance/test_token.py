"""token vectors: Guava's SmoothBursty and SmoothWarmingUp (cold factor 3), against every store.

The expected waits come from Guava's documented formulas; the warm-up ones are also
checked against an independent model below, which integrates the documented
interval curve numerically instead of using the closed form.
"""

from __future__ import annotations

from gateway.limits import token
from gateway.limits.outcome import AlgoOutcome
from tests.support.conformance import Scenario, config


def token_config(rate: str, warmup: str = "0s", max_delay: str = "0s", routes: str = "", zones: str = "") -> str:
    return config(
        f"  bucket: {{type: token, key: $arg_k, rate: {rate}, warmup: {warmup}, max_delay: {max_delay}}}" + zones,
        "  - {location: /, upstream: app, limits: [{zone: bucket}]}" + routes,
    )


def cold_curve_cost(stored: float, take: float, rate: float, warmup_s: float, steps: int = 20_000) -> float:
    """Independent model: µs to take ``take`` of ``stored`` permits, by midpoint integration.

    Guava documents the interval to take the permit at ``x`` stored as a function that is
    stable (1/rate) up to threshold = 0.5 * warmup * rate and then grows linearly to
    3/rate at max = threshold + warmup * rate / 2; the cost is the area under it.
    """
    stable = 1e6 / rate
    threshold = 0.5 * warmup_s * rate
    top = threshold + 2.0 * warmup_s * 1e6 / (stable + 3 * stable)
    width = take / steps
    area = 0.0
    for k in range(steps):
        x = stored - take + (k + 0.5) * width
        above = max(0.0, x - threshold)
        area += (stable + above * (2 * stable) / (top - threshold)) * width
    return area


def test_closed_form_matches_the_independent_model():
    params = token.TokenParams.of(5, 1, 3000, 0)
    assert (params.threshold, params.max_permits) == (7.5, 15.0)
    for stored in (15.0, 14.0, 10.5, 8.0, 7.9, 7.5, 3.0):
        for take in (1.0, 0.5):
            if take > stored:
                continue
            assert abs(token.stored_wait(params, stored, take) - cold_curve_cost(stored, take, 5, 3)) < 2.0
    # the whole warm-up: taking every permit above the threshold takes `warmup` seconds
    assert abs(cold_curve_cost(15.0, 7.5, 5, 3) - 3e6) < 1.0


async def _steady(s: Scenario, n: int, start: int = 0) -> tuple[list[int], int]:
    """Requests that each arrive as the previous one is let through: their delays (ms)."""
    t, delays = start, []
    for _ in range(n):
        outcome = (await s.hit("/", t)).verdict.algo[0]
        assert outcome is not None and outcome.allowed
        delays.append(outcome.delay_ms)
        t += outcome.delay_ms
    return delays, t


async def test_warmup_cold_start_spaces_at_0_6_s_and_converges_to_0_2_s(store, clock):
    s = Scenario(store, clock, token_config("5r/s", warmup="3s", max_delay="10s"))
    delays, _ = await _steady(s, 14)
    assert delays[0] == 0  # the first permit is free
    # each delay is the cost of the permit the previous request took, from 15 stored down
    expected = [0] + [round(cold_curve_cost(15.0 - i, 1.0, 5, 3) / 1000) for i in range(13)]
    assert all(abs(a - b) <= 2 for a, b in zip(delays, expected, strict=True)), (delays, expected)
    assert 560 <= delays[1] <= 580  # ~0.6 s when cold
    assert delays[10:] == [200] * 4  # warm: the stable 0.2 s
    assert 2900 <= sum(delays[:9]) <= 3300  # after about 3 s of steady demand


async def test_an_idle_key_refills_towards_cold(store, clock):
    s = Scenario(store, clock, token_config("5r/s", warmup="3s", max_delay="10s"))
    _, t = await _steady(s, 12)
    # idle for the whole warm-up period: cold again
    delays, _ = await _steady(s, 2, start=t + 200 + 3000)
    assert delays[0] == 0 and 560 <= delays[1] <= 580
    # idle 1.5 s only: half way back (12 taken from 15 leave 3; 7.5 come back: 10.5)
    _, t = await _steady(s, 12, start=t + 10_000)
    delays, _ = await _steady(s, 3, start=t + 200 + 1500)
    expected = [0, round(cold_curve_cost(10.5, 1.0, 5, 3) / 1000), round(cold_curve_cost(9.5, 1.0, 5, 3) / 1000)]
    assert expected == [0, 333, 280]
    assert all(abs(a - b) <= 2 for a, b in zip(delays, expected, strict=True)), delays


async def test_bursty_first_permits_free_then_max_delay_then_rejected_without_taking(store, clock):
    s = Scenario(store, clock, token_config("2r/s", max_delay="1s"))

    async def at(t: int) -> AlgoOutcome:
        outcome = (await s.hit("/", t)).verdict.algo[0]
        assert outcome is not None
        return outcome

    # a new key holds one second of permits (2), then pays in advance for the third
    got = [await at(0) for _ in range(6)]
    assert [(o.allowed, o.delay_ms) for o in got] == [
        (True, 0),
        (True, 0),
        (True, 0),
        (True, 500),
        (True, 1000),
        (False, 0),  # would wait 1.5 s > max_delay
    ]
    assert got[5].retry_after_s == 1
    later = await at(500)  # the rejected request took nothing: next free is 1500 = 500 + max_delay
    assert (later.allowed, later.delay_ms) == (True, 1000)


async def test_no_max_delay_rejects_instead_of_waiting(store, clock):
    s = Scenario(store, clock, token_config("1r/s"))
    assert [(await s.hit("/", 0)).verdict.algo_rejected for _ in range(3)] == [-1, -1, 0]
    assert (await s.hit("/", 999)).verdict.algo_rejected == 0
    assert (await s.hit("/", 1000)).verdict.algo_rejected == -1


async def test_rejection_by_the_bucket_charges_no_limit_req(store, clock):
    s = Scenario(
        store,
        clock,
        token_config(
            "1r/m",
            routes="\n  - {location: /both, upstream: app, limits: [{zone: rate, burst: 10}, {zone: bucket}]}"
            "\n  - {location: /rate, upstream: app, limit_req: [{zone: rate, burst: 10}]}",
            zones="\n  rate: {type: req, key: $arg_k, rate: 1r/s}",
        ),
    )
    # 1r/m holds 1/60 of a permit: the first request pays ~59 s in advance for the rest
    assert [(await s.hit("/both", 0)).verdict.algo_rejected for _ in range(3)] == [-1, 0, 0]
    follow = await s.hit("/rate", 0)
    assert (follow.req, follow.delay_ms) == ("DELAYED", 1000)  # only the request that passed


async def test_a_waiting_request_takes_its_conn_slot_after_the_wait(store, clock):
    s = Scenario(
        store,
        clock,
        token_config(
            "2r/s",
            max_delay="5s",
            routes="\n  - {location: /c, upstream: app, limits: [{zone: bucket}, {zone: conns, max: 10}]}",
            zones="\n  conns: {type: conn, key: $arg_k}",
        ),
    )
    for _ in range(3):
        outcome = await s.hit("/c", 0)
        assert outcome.verdict.conn is not None  # no wait: the slot is taken in the same step
        store.release(s.routes["/c"], outcome.verdict.conn)
    waiting = await s.hit("/c", 0)
    assert waiting.verdict.algo[0].delay_ms == 500
    assert waiting.verdict.conn is None  # taken after the wait, as after a limit_req delay


async def test_rejected_by_limit_req_takes_no_permit(store, clock):
    # on a cluster the req key and the token key sit in different slots: the token's
    # group commits, the req group rejects, and the permit is given back (undo.lua)
    s = Scenario(
        store,
        clock,
        token_config(
            "10r/s",
            routes="\n  - {location: /both, upstream: app, limits: [{zone: rate}, {zone: bucket}]}",
            zones="\n  rate: {type: req, key: $arg_k, rate: 1r/m}",
        ),
    )
    first = await s.hit("/both", 0)
    assert first.req == "PASSED" and first.verdict.algo[0].remaining == 9  # 10 stored, one taken
    assert (await s.hit("/both", 0)).req == "REJECTED"
    assert (await s.hit("/", 0)).verdict.algo[0].remaining == 8  # the rejected request took none
