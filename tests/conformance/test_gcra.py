"""gcra vectors (reference §6 and §8 V17, redis-cell's CL.THROTTLE) against every store.

Each answer is CL.THROTTLE's reply: (limited, limit, remaining, retry_after, reset_after).
"""

from __future__ import annotations

from gateway.limits.outcome import AlgoOutcome
from gateway.store.redis import connect
from tests.support.conformance import Scenario, config


def gcra_config(burst: int, rate: str, extra_routes: str = "", extra_zones: str = "") -> str:
    return config(
        f"  cell: {{type: gcra, key: $arg_k, burst: {burst}, rate: {rate}}}" + extra_zones,
        "  - {location: /, upstream: app, limits: [{zone: cell}]}" + extra_routes,
    )


def reply(outcome: AlgoOutcome | None) -> tuple[int, int, int, int, int]:
    assert outcome is not None
    return (0 if outcome.allowed else 1, outcome.limit, outcome.remaining, outcome.retry_after_s, outcome.reset_s)


async def test_v17_redis_cell_it_rate_limits(store, clock):
    s = Scenario(store, clock, gcra_config(4, "1r/s"))

    async def throttle(t: int, quantity: int = 1) -> tuple[int, int, int, int, int]:
        return reply((await s.hit("/", t, cost=quantity)).verdict.algo[0])

    assert await throttle(0, 6) == (1, 5, 5, -1, 0)  # larger than the capacity: never, nothing stored
    assert [await throttle(0) for _ in range(5)] == [
        (0, 5, 4, -1, 1),
        (0, 5, 3, -1, 2),
        (0, 5, 2, -1, 3),
        (0, 5, 1, -1, 4),
        (0, 5, 0, -1, 5),
    ]
    assert await throttle(0) == (1, 5, 0, 1, 5)
    assert await throttle(3000) == (0, 5, 2, -1, 3)
    assert await throttle(3100) == (0, 5, 1, -1, 4)  # reset 3.9 s rounds up
    assert await throttle(4000) == (0, 5, 1, -1, 4)
    assert await throttle(8000) == (0, 5, 4, -1, 1)
    assert await throttle(9500) == (0, 5, 4, -1, 1)
    assert await throttle(9500, 0) == (0, 5, 4, -1, 1)  # quantity 0 peeks
    assert await throttle(9500, 2) == (0, 5, 2, -1, 3)
    assert await throttle(9500, 5) == (1, 5, 2, 3, 3)


async def test_v17_e2e_burst_zero_one_per_two_seconds(store, clock):
    # CL.THROTTLE user123 0 1 2 1: 1 per 2 s is 30r/m
    s = Scenario(store, clock, gcra_config(0, "30r/m"))
    assert reply((await s.hit("/", 0)).verdict.algo[0]) == (0, 1, 0, -1, 2)
    assert reply((await s.hit("/", 0)).verdict.algo[0]) == (1, 1, 0, 2, 2)
    assert reply((await s.hit("/", 2000)).verdict.algo[0]) == (0, 1, 0, -1, 2)


async def test_readme_example_fifteen_burst_thirty_per_minute(store, clock):
    # CL.THROTTLE user123 15 30 60 on a fresh key -> [0, 16, 15, -1, 2] (T = 2 s, tau = 32 s)
    s = Scenario(store, clock, gcra_config(15, "30r/m"))
    outcome = await s.hit("/", 0)
    assert reply(outcome.verdict.algo[0]) == (0, 16, 15, -1, 2)
    assert outcome.verdict.algo_rejected == -1


async def test_keys_are_independent(store, clock):
    s = Scenario(store, clock, gcra_config(0, "1r/m"))
    assert [(await s.hit("/", 0, algo=k)).verdict.algo_rejected for k in (b"a", b"a", b"b", b"b")] == [-1, 0, -1, 0]


async def test_rejection_by_gcra_charges_no_limit_req_and_no_count(store, clock):
    s = Scenario(
        store,
        clock,
        gcra_config(
            0,
            "1r/h",
            "\n  - {location: /all, upstream: app, limit_req: [{zone: rate, burst: 10}], limit_count: [{zone: quota}],"
            " limits: [{zone: cell}]}\n  - {location: /rate, upstream: app, limits: [{zone: rate, burst: 10}]}"
            "\n  - {location: /quota, upstream: app, limits: [{zone: quota}]}",
            "\n  rate: {type: req, key: $arg_k, rate: 1r/s}\n  quota: {type: count, key: $arg_k, limit: 2, window: 1h}",
        ),
    )
    first = await s.hit("/all", 0)
    assert (first.req, first.count, first.verdict.algo_rejected) == ("PASSED", "PASSED", -1)
    second = await s.hit("/all", 0)
    assert second.verdict.algo_rejected == 0
    assert reply(second.verdict.algo[0])[:2] == (1, 1)
    # neither the rate zone nor the quota zone was charged for the rejected request
    follow = await s.hit("/rate", 0)
    assert (follow.req, follow.delay_ms) == ("DELAYED", 1000)
    quota = await s.hit("/quota", 0)
    assert quota.verdict.count_used == [2]


async def test_rejected_by_limit_req_charges_no_gcra(store, clock):
    s = Scenario(
        store,
        clock,
        gcra_config(
            1,
            "1r/h",
            "\n  - {location: /both, upstream: app, limits: [{zone: rate}, {zone: cell}]}",
            "\n  rate: {type: req, key: $arg_k, rate: 1r/m}",
        ),
    )
    assert (await s.hit("/both", 0)).req == "PASSED"
    assert (await s.hit("/both", 1)).req == "REJECTED"
    # the gcra zone holds one request: one more unit of burst is left
    assert reply((await s.hit("/", 2)).verdict.algo[0])[:3] == (0, 2, 0)


async def test_dry_run_reports_but_stores_nothing_for_the_rejected(store, clock):
    s = Scenario(
        store,
        clock,
        gcra_config(0, "1r/m", "\n  - {location: /dry, upstream: app, dry_run: true, limits: [{zone: cell}]}"),
    )
    assert (await s.hit("/dry", 0)).verdict.algo_rejected == -1
    dry = await s.hit("/dry", 10)
    assert dry.verdict.algo_rejected == 0
    assert reply(dry.verdict.algo[0]) == (1, 1, 0, 60, 60)
    assert reply((await s.hit("/", 60_000)).verdict.algo[0]) == (0, 1, 0, -1, 60)


async def test_redis_key_holds_the_tat_in_ns_like_redis_cell(store, clock):
    """The stored value is CL.THROTTLE's: the TAT as decimal ns since the epoch, with its PEXPIRE."""
    if store.kind != "redis":
        return
    # The test's own client, connected before the calls: the TAT is in the future of a
    # fake clock, and the key expires a few hundred ms after it is written.
    client = connect(store.spec, 2.0)
    await client.ping()
    try:
        epoch_ms = 1_790_000_000_123  # a 2026 wall clock: ns values far above 2^53
        clock.now = epoch_ms
        s = Scenario(store, clock, gcra_config(2, "7r/s"))
        clock.now = epoch_ms
        route = s.routes["/"]
        await store.admit(route, [], [], [], [(b"k", 1)])
        await store.admit(route, [], [], [], [(b"k", 2)])
        key = store.prefix + b"cell:k"
        raw = await client.get(key)
        emission = int(1e9 / 7)  # 142857142 ns
        assert raw == str(epoch_ms * 1_000_000 + 3 * emission).encode()
        assert 0 < await client.pttl(key) <= 3 * emission // 1_000_000
        # a TAT written by another node (or CL.THROTTLE itself) is read back to the ns
        await client.set(key, str(epoch_ms * 1_000_000 + 2 * emission + 1))
        verdict = await store.admit(route, [], [], [], [(b"k", 1)])
        assert verdict.algo[0] is not None and not verdict.algo[0].allowed
        assert (await client.get(key)) == str(epoch_ms * 1_000_000 + 2 * emission + 1).encode()
    finally:
        await (client.aclose() if store.cluster else client.aclose(close_connection_pool=True))
