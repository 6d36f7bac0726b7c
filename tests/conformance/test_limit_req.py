"""limit_req vectors (reference §8: V1-V9) against every store, with a fake clock."""

from __future__ import annotations

import pytest

from tests.support.conformance import Scenario, config


def two_rps(burst: str) -> str:
    return config(
        "  one: {type: req, key: $binary_remote_addr, rate: 2r/s}",
        f"  - {{location: /, upstream: app, limit_req: [{burst}]}}",
    )


async def test_v1_basic_nodelay_rejections_are_not_charged(store, clock):
    s = Scenario(store, clock, two_rps("{zone: one, burst: 1, nodelay: true}"))
    assert (await s.hit("/", 0)).req == "PASSED"
    second = await s.hit("/", 1)
    assert second.req == "PASSED"
    assert second.excess == 998
    third = await s.hit("/", 2)
    assert third.req == "REJECTED"
    if store.engine == "nginx":
        assert third.excess == 1996
    assert (await s.hit("/", 3)).req == "REJECTED"
    assert (await s.hit("/", 1200)).req == "PASSED"


async def test_v1_fast_zone_negative_excess_is_clamped(store, clock):
    s = Scenario(
        store,
        clock,
        config(
            "  fast: {type: req, key: $binary_remote_addr, rate: 1000r/s}",
            "  - {location: /, upstream: app, limit_req: [{zone: fast, burst: 1}]}",
        ),
    )
    assert (await s.hit("/", 0)).req == "PASSED"
    drained = await s.hit("/", 100)  # 100 ms leak 100 requests' worth: the excess clamps at 0
    assert (drained.req, drained.excess) == ("PASSED", 0)
    same_ms = await s.hit("/", 100)
    assert (same_ms.req, same_ms.delay_ms) == ("DELAYED", 1)  # excess 1000 at 1000r/s waits 1 ms
    assert (await s.hit("/", 100)).req == "REJECTED"


async def test_v2_two_zones_earlier_zone_not_charged(store, clock):
    s = Scenario(
        store,
        clock,
        config(
            "  slow: {type: req, key: $arg_a, rate: 1r/m}\n  fast: {type: req, key: $arg_b, rate: 1000r/s}",
            "  - {location: /, upstream: app, limit_req: [{zone: fast}, {zone: slow}]}",
        ),
    )
    assert (await s.hit("/", 0, [b"1", b""])).req == "PASSED"  # b=1
    assert (await s.hit("/", 100, [b"1", b""])).req == "PASSED"
    assert (await s.hit("/", 200, [b"", b"1"])).req == "PASSED"  # a=1
    assert (await s.hit("/", 300, [b"", b"1"])).req == "REJECTED"
    assert (await s.hit("/", 400, [b"2", b"2"])).req == "PASSED"  # a=2&b=2
    rejected = await s.hit("/", 500, [b"2", b"2"])
    assert rejected.req == "REJECTED"
    assert (await s.hit("/", 600, [b"", b""])).req == ""  # no key: not limited, no status
    assert (await s.hit("/", 700, [b"", b""])).req == ""
    # fast was not charged by the rejected request: b=2 alone passes undelayed
    assert (await s.hit("/", 500, [b"2", b""])).delay_ms == 0


async def test_v3_two_stage_delay(store, clock):
    s = Scenario(
        store,
        clock,
        config(
            "  one: {type: req, key: $binary_remote_addr, rate: 30r/m}",
            "  - {location: /, upstream: app, limit_req: [{zone: one, burst: 2, delay: 1}]}",
        ),
    )
    assert (await s.hit("/", 0)).req == "PASSED"
    second = await s.hit("/", 0)
    assert (second.req, second.excess) == ("PASSED", 1000)
    third = await s.hit("/", 0)
    assert (third.req, third.delay_ms) == ("DELAYED", 2000)
    fourth = await s.hit("/", 200)
    assert fourth.req == "REJECTED"
    assert fourth.excess == 2900


async def test_v4_dry_run_accounts_but_never_refuses(store, clock):
    s = Scenario(
        store,
        clock,
        config(
            "  one: {type: req, key: $binary_remote_addr, rate: 1r/m}",
            "  - {location: /delay, upstream: app, dry_run: true, limit_req: [{zone: one, burst: 2}]}\n"
            "  - {location: /reject, upstream: app, dry_run: true, limit_req: [{zone: one}]}\n"
            "  - {location: /reject/off, upstream: app, limit_req: [{zone: one}]}",
        ),
    )
    assert (await s.hit("/delay", 0)).req == "PASSED"
    delayed = await s.hit("/delay", 1)
    # nginx truncates the 1 ms leak at 1r/m to 0: 1000 * 1000 // 16. lua-resty leaks 0.016 m-req
    # (excess 999.984), Redis replies 999 and the library waits 999 / 16 s = 62437 ms
    expected_delay = 62500 if store.engine == "nginx" else 62437
    assert (delayed.req, delayed.delay_ms) == ("DELAYED_DRY_RUN", expected_delay)
    assert (await s.hit("/reject", 2)).req == "REJECTED_DRY_RUN"
    final = await s.hit("/reject/off", 3)
    assert final.req == "REJECTED"
    # 1000 stored by the dry-run delayed request + 1000 (lua-resty: 999.984 - 0.032 + 1000, truncated)
    assert final.excess == (2000 if store.engine == "nginx" else 1999)


@pytest.mark.parametrize(
    ("key", "times", "expected"),
    [
        (b"e1", [0, 60500, 63100], ["PASSED", "REJECTED", "PASSED"]),
        (b"e2", [0, 62300, 62800], ["PASSED", "REJECTED", "PASSED"]),
    ],
)
async def test_v5_per_minute_rates_are_truncated(store, clock, key, times, expected):
    s = Scenario(
        store,
        clock,
        config(
            "  one: {type: req, key: $arg_k, rate: 1r/m}",
            "  - {location: /, upstream: app, limit_req: [{zone: one}]}",
        ),
    )
    results = [(await s.hit("/", t, key)).req for t in times]
    assert results == expected  # an ideal 1 r/min limiter would accept at 60 s; nginx waits 62.5 s


async def test_v6_burst_with_delays(store, clock):
    s = Scenario(store, clock, two_rps("{zone: one, burst: 3}"))
    outcomes = [await s.hit("/", 0) for _ in range(5)]
    assert [(o.req, o.delay_ms) for o in outcomes] == [
        ("PASSED", 0),
        ("DELAYED", 500),
        ("DELAYED", 1000),
        ("DELAYED", 1500),
        ("REJECTED", 0),
    ]
    assert outcomes[4].excess == 4000


async def test_v7_nodelay(store, clock):
    s = Scenario(store, clock, two_rps("{zone: one, burst: 3, nodelay: true}"))
    outcomes = [(await s.hit("/", 0)).req for _ in range(5)]
    assert outcomes == ["PASSED"] * 4 + ["REJECTED"]


async def test_v8_several_limits_longest_delay_wins(store, clock):
    s = Scenario(
        store,
        clock,
        config(
            "  a: {type: req, key: $binary_remote_addr, rate: 1r/s}\n  b: {type: req, key: $binary_remote_addr, rate: 2r/s}",
            "  - {location: /, upstream: app, limit_req: [{zone: a, burst: 5}, {zone: b, burst: 5}]}",
        ),
    )
    outcomes = [await s.hit("/", 0) for _ in range(3)]
    assert [(o.req, o.delay_ms) for o in outcomes] == [("PASSED", 0), ("DELAYED", 1000), ("DELAYED", 2000)]


async def test_v9_rejection_by_a_later_limit_rolls_back_earlier_ones(store, clock):
    s = Scenario(
        store,
        clock,
        config(
            "  a: {type: req, key: $arg_k, rate: 1r/s}\n  b: {type: req, key: $arg_b, rate: 1r/m}",
            "  - {location: /, upstream: app, limit_req: [{zone: a, burst: 5}, {zone: b}]}",
        ),
    )
    assert (await s.hit("/", 0, [b"k", b"b1"])).req == "PASSED"
    assert (await s.hit("/", 0, [b"k", b"b1"])).req == "REJECTED"
    third = await s.hit("/", 0, [b"k", b"b2"])
    assert (third.req, third.delay_ms) == ("DELAYED", 1000)  # a's excess is 1000, not 2000


async def test_first_request_of_a_key_is_accepted_even_with_burst_zero(store, clock):
    s = Scenario(
        store,
        clock,
        config(
            "  one: {type: req, key: $arg_k, rate: 1r/m}", "  - {location: /, upstream: app, limit_req: [{zone: one}]}"
        ),
    )
    for i in range(20):
        first = await s.hit("/", i, f"key{i}".encode())
        assert (first.req, first.excess) == ("PASSED", 0)


async def test_keys_are_independent(store, clock):
    s = Scenario(store, clock, two_rps("{zone: one}"))
    assert (await s.hit("/", 0, b"a")).req == "PASSED"
    assert (await s.hit("/", 0, b"a")).req == "REJECTED"
    assert (await s.hit("/", 0, b"b")).req == "PASSED"


async def test_ban_rejects_without_charging_until_it_ends(store, clock):
    s = Scenario(
        store,
        clock,
        config(
            "  one: {type: req, key: $arg_k, rate: 2r/s, ban: 2s}",
            "  - {location: /, upstream: app, limit_req: [{zone: one}]}",
        ),
    )
    results = []
    for i in range(12):
        outcome = await s.hit("/", i * 200, b"bad")
        results.append((outcome.req, outcome.verdict.req.rc))
    # V16 (lua-resty-redis-ratelimit sanity.t TEST 8): #1 passes, #2 overflows and starts a
    # 2 s ban, #3..#11 are forbidden, #12 (t = 2.2 s, after the ban) starts afresh.
    assert [r for r, _ in results[:11]] == ["PASSED"] + ["REJECTED"] * 10
    assert results[1][1] == 3 and all(rc == 5 for _, rc in results[2:11])
    assert (await s.hit("/", 2400, b"good")).req == "PASSED"  # other keys are unaffected
    if store.engine == "resty":
        # lua-resty-redis-ratelimit's ban is a Redis TTL: it runs on Redis' clock, not the
        # caller's, so a fake clock cannot end it (tests/redis/test_redis_store.py checks it in real time).
        assert results[11][0] == "REJECTED"
        return
    assert results[11][0] == "PASSED"
    assert (await s.hit("/", 2201, b"bad")).req == "REJECTED"  # and the next overflow bans again
