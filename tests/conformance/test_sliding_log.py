"""sliding_log vectors: an exact sliding window of request times, against every store."""

from __future__ import annotations

from gateway.limits.outcome import AlgoOutcome
from gateway.store.redis import connect
from tests.support.conformance import Scenario, config


def log_config(limit: int, window: str, extra_routes: str = "", extra_zones: str = "") -> str:
    return config(
        f"  log: {{type: sliding_log, key: $arg_k, limit: {limit}, window: {window}}}" + extra_zones,
        "  - {location: /, upstream: app, limits: [{zone: log}]}" + extra_routes,
    )


def fields(outcome: AlgoOutcome | None) -> tuple[bool, int, int, int]:
    assert outcome is not None
    return outcome.allowed, outcome.remaining, outcome.retry_after_s, outcome.reset_s


async def test_exact_window_remaining_retry_and_reset(store, clock):
    s = Scenario(store, clock, log_config(3, "10s"))

    async def at(t: int) -> tuple[bool, int, int, int]:
        return fields((await s.hit("/", t)).verdict.algo[0])

    assert [await at(t) for t in (0, 1000, 2000)] == [(True, 2, -1, 10), (True, 1, -1, 10), (True, 0, -1, 10)]
    assert await at(3000) == (False, 0, 7, 9)  # the oldest leaves at 10000, the newest at 12000
    for t in range(3000, 10000, 500):  # rejected requests are not logged
        assert (await at(t))[0] is False
    assert await at(9999) == (False, 0, 1, 3)  # 1 ms left: rounded up to a second
    assert await at(10000) == (True, 0, -1, 10)  # the request at 0 is out of (0, 10000]
    assert await at(10500) == (False, 0, 1, 10)  # 1000 + 10000 - 10500 = 500 ms
    assert await at(11000) == (True, 0, -1, 10)
    assert await at(40000) == (True, 2, -1, 10)  # all gone


async def test_a_key_never_holds_more_than_limit_entries(store, clock):
    s = Scenario(store, clock, log_config(5, "1h"))
    for t in range(0, 200, 2):
        await s.hit("/", t)
    if store.kind == "memory":
        assert len(store.zones["log"].lookup(b"k")) == 5
    elif store.kind == "redis":
        client = connect(store.spec, 2.0)  # a client of the test's own, not the store's
        try:
            assert await client.zcard(store._tagged_key("log", b"k")) == 5
        finally:
            await (client.aclose() if store.cluster else client.aclose(close_connection_pool=True))


async def test_rejection_by_the_log_charges_no_limit_req(store, clock):
    s = Scenario(
        store,
        clock,
        log_config(
            1,
            "1h",
            "\n  - {location: /both, upstream: app, limits: [{zone: rate, burst: 10}, {zone: log}]}"
            "\n  - {location: /rate, upstream: app, limit_req: [{zone: rate, burst: 10}]}",
            "\n  rate: {type: req, key: $arg_k, rate: 1r/s}",
        ),
    )
    assert (await s.hit("/both", 0)).verdict.algo_rejected == -1
    assert (await s.hit("/both", 0)).verdict.algo_rejected == 0
    assert (await s.hit("/both", 0)).verdict.algo_rejected == 0
    follow = await s.hit("/rate", 0)
    assert (follow.req, follow.delay_ms) == ("DELAYED", 1000)  # only the first request was charged


async def test_dry_run_logs_only_what_passes(store, clock):
    s = Scenario(
        store,
        clock,
        log_config(1, "10s", "\n  - {location: /dry, upstream: app, dry_run: true, limits: [{zone: log}]}"),
    )
    assert fields((await s.hit("/dry", 0)).verdict.algo[0])[0] is True
    assert (await s.hit("/dry", 5000)).verdict.algo_rejected == 0
    assert fields((await s.hit("/", 10000)).verdict.algo[0])[0] is True  # the dry rejection was not logged
