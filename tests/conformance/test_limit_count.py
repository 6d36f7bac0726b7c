"""limit_count vectors (reference §8 V12, resty.limit.count) against every store."""

from __future__ import annotations

from tests.support.conformance import Scenario, config


def count_config(limit: int, window: str) -> str:
    return config(
        f"  quota: {{type: count, key: $arg_k, limit: {limit}, window: {window}}}",
        "  - {location: /, upstream: app, limit_count: [{zone: quota}]}",
    )


async def test_v12_ten_per_window_then_rejected(store, clock):
    s = Scenario(store, clock, count_config(10, "100s"))
    remaining = []
    for i in range(12):
        outcome = await s.hit("/", i)
        used = outcome.verdict.count_used[0]
        remaining.append(10 - used if outcome.count == "PASSED" else "rejected")
    assert remaining == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, "rejected", "rejected"]


async def test_v12_keys_are_independent(store, clock):
    s = Scenario(store, clock, count_config(1, "10s"))
    assert [(await s.hit("/", 0, count=k)).count for k in (b"foo", b"foo", b"bar", b"bar")] == [
        "PASSED",
        "REJECTED",
        "PASSED",
        "REJECTED",
    ]


async def test_v12_window_starts_at_first_request_and_resets(store, clock):
    s = Scenario(store, clock, count_config(1, "1s"))
    assert (await s.hit("/", 0)).count == "PASSED"
    assert (await s.hit("/", 500)).count == "REJECTED"
    assert (await s.hit("/", 1000)).count == "PASSED"  # the window ended exactly 1 s after the first request
    assert (await s.hit("/", 1999)).count == "REJECTED"


async def test_reset_is_reported_until_the_window_ends(store, clock):
    s = Scenario(store, clock, count_config(3, "60s"))
    first = await s.hit("/", 0)
    assert first.verdict.count_reset_ms == [60000]
    later = await s.hit("/", 15000)
    assert later.verdict.count_reset_ms == [45000]
    assert later.verdict.count_used == [2]


async def test_rejected_by_count_charges_no_limit_req(store, clock):
    s = Scenario(
        store,
        clock,
        config(
            "  rate: {type: req, key: $arg_k, rate: 1r/s}\n  quota: {type: count, key: $arg_k, limit: 1, window: 1h}",
            "  - {location: /, upstream: app, limit_req: [{zone: rate, burst: 10}], limit_count: [{zone: quota}]}\n"
            "  - {location: /rate, upstream: app, limit_req: [{zone: rate, burst: 10}]}",
        ),
    )
    assert (await s.hit("/", 0)).count == "PASSED"
    rejected = await s.hit("/", 0)
    assert rejected.count == "REJECTED"
    # the rate zone holds only the first request's charge
    follow = await s.hit("/rate", 0)
    assert (follow.req, follow.delay_ms) == ("DELAYED", 1000)
