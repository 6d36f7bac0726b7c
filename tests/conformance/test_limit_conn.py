"""limit_conn (reference §8 V10) against every store."""

from __future__ import annotations

import asyncio

from tests.support.conformance import Scenario, config


async def settle() -> None:
    """Releases are fire-and-forget in a shared store: let them land."""
    await asyncio.sleep(0.05)


ZONES = "  c: {type: conn, key: $arg_u}\n  c2: {type: conn, key: $arg_u}"
ROUTES = (
    "  - {location: /one, upstream: app, limit_conn: [{zone: c, max: 1}]}\n"
    "  - {location: /five, upstream: app, limit_conn: [{zone: c, max: 5}]}\n"
    "  - {location: /dry, upstream: app, dry_run: true, limit_conn: [{zone: c, max: 1}]}\n"
    "  - {location: /both, upstream: app, limit_conn: [{zone: c, max: 5}, {zone: c2, max: 1}]}\n"
    "  - {location: /c2, upstream: app, limit_conn: [{zone: c2, max: 1}]}"
)


async def test_v10_slots_are_held_and_rolled_back(store, clock):
    s = Scenario(store, clock, config(ZONES, ROUTES))
    held = (await s.hit("/one", 0, conn=b"u")).verdict.conn
    assert held is not None and held.rejected == -1 and held.counts == [1]
    assert (await s.hit("/one", 0, conn=b"u")).verdict.conn.rejected == 0
    five = (await s.hit("/five", 0, conn=b"u")).verdict.conn
    assert five.rejected == -1 and five.counts == [2]
    dry = (await s.hit("/dry", 0, conn=b"u")).verdict.conn
    assert dry.rejected == 0 and dry.taken == []  # rejected in dry run: no slot taken
    other = (await s.hit("/one", 0, conn=b"other")).verdict.conn
    assert other.rejected == -1
    # c2's slot for u is held; /both takes c, then fails on c2 and gives c back
    c2 = (await s.hit("/c2", 0, conn=b"u")).verdict.conn
    assert c2.rejected == -1
    both = (await s.hit("/both", 0, conn=b"u")).verdict.conn
    assert both.rejected == 1 and both.taken == []
    route = s.routes["/five"]
    for decision in (held, five, other, c2):
        store.release(route, decision)
    await settle()
    assert (await s.hit("/one", 0, conn=b"u")).verdict.conn.rejected == -1


async def test_empty_key_is_not_counted(store, clock):
    s = Scenario(store, clock, config(ZONES, ROUTES))
    for _ in range(3):
        decision = (await s.hit("/one", 0, conn=b"")).verdict.conn
        assert decision.rejected == -1 and decision.counts == [None] and not decision.applied


async def test_a_delayed_request_takes_its_slot_later(store, clock):
    s = Scenario(
        store,
        clock,
        config(
            "  r: {type: req, key: $arg_u, rate: 1r/s}\n" + ZONES,
            "  - {location: /, upstream: app, limit_req: [{zone: r, burst: 5}], limit_conn: [{zone: c, max: 1}]}",
        ),
    )
    first = await s.hit("/", 0, req=b"u", conn=b"u")
    assert first.verdict.conn is not None and first.verdict.conn.rejected == -1
    second = await s.hit("/", 0, req=b"u", conn=b"u")
    assert second.delay_ms == 1000
    assert second.verdict.conn is None  # not taken while it waits
    store.release(s.routes["/"], first.verdict.conn)
    await settle()
    later = await store.acquire_conn(s.routes["/"], [b"u"])
    assert later.rejected == -1
