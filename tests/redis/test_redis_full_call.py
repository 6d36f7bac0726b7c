"""The Redis store's short path (a route whose every limit has a key) against its general
path: the same random traffic, at the same clock values, must get the same verdicts."""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import asdict

import pytest

from gateway.config.store import RedisSpec
from gateway.limits import nginx_req
from gateway.plan import load_config_text
from gateway.store.redis import RedisStore
from tests.support.conformance import FakeClock

CONFIG = """
zones:
  fast: {type: req, key: $arg_k, rate: 5r/s}
  slow: {type: req, key: $arg_k, rate: 2r/s, ban: 2s}
  window: {type: count, key: $arg_k, limit: 3, window: 2s}
  conns: {type: conn, key: $arg_k}
  more: {type: conn, key: $arg_k}
upstreams:
  app: {servers: [127.0.0.1:9]}
routes:
  - location: /all
    upstream: app
    limit_req: [{zone: fast, burst: 3, delay: 1}, {zone: slow, burst: 2, nodelay: true}]
    limit_count: [{zone: window}]
    limit_conn: [{zone: conns, max: 2}, {zone: more, max: 3}]
  - {location: /req, upstream: app, limit_req: [{zone: fast, burst: 2}]}
  - {location: /conn, upstream: app, limit_conn: [{zone: conns, max: 1}]}
"""

RC = {nginx_req.DECLINED: "DECLINED", nginx_req.OK: "OK", nginx_req.BUSY: "BUSY", nginx_req.FORBIDDEN: "FORBIDDEN"}


def _plain(verdict) -> tuple[dict, int]:
    """A verdict as data, with the Redis store's lease handles (a per-store member) left out,
    and apart from it the end of a ban: a ban Redis reports runs on the key's PTTL, i.e. on
    real time, which moves between the two stores' calls."""
    data = asdict(verdict)
    if data["conn"] is not None:
        data["conn"]["taken"] = [key.split(b":", 1)[1] for key, _ in data["conn"]["taken"]]
    ban_until = data["req"].pop("ban_until") if data["req"] else 0
    return data, ban_until


@pytest.mark.timing
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_short_path_decides_as_the_general_one(redis_session, seed):
    config = load_config_text(CONFIG)
    routes = {r.location.value: r for r in config.routes}
    clock = FakeClock()
    stores = []
    for full in (True, False):
        store = RedisStore(
            RedisSpec(url=redis_session.url, timeout_ms=2000, on_error="deny", prefix=f"t{uuid.uuid4().hex[:8]}:"),
            clock_ms=clock,
        )
        store.full_calls = full
        store.configure(config.spec.zones)
        await store.start()
        stores.append(store)
    rng = random.Random(seed)
    held: list[tuple[object, list]] = []  # (route, decisions of both stores) still holding slots
    outcomes: set[str] = set()
    widest_gap = 0.0  # the longest real time between the two stores' calls of one step so far
    try:
        for _ in range(400):
            clock.now += rng.choice([0, 0, 10, 50, 120, 400])
            location = rng.choice(["/all", "/all", "/req", "/conn"])
            route = routes[location]
            key = rng.choice([b"a", b"b", b"c", b"x" * 300])  # a long key: a conn zone skips it
            keys = ([key] * len(route.limit_req), [key] * len(route.limit_count), [key] * len(route.limit_conn))
            started = time.monotonic()
            verdicts = [await store.admit(route, *keys) for store in stores]
            gap = time.monotonic() - started
            widest_gap = max(widest_gap, gap)
            (short, short_ban), (general, general_ban) = (_plain(verdict) for verdict in verdicts)
            assert short == general, (location, key)
            # the two ends differ by the real time between the stores' calls when the ban was
            # set (at most the widest gap so far) and when it was read (this step's gap)
            assert abs(short_ban - general_ban) <= (widest_gap + gap) * 1000 + 2, (location, key)
            v = verdicts[0]
            if v.req is not None:
                outcomes.add(RC[v.req.rc] + (" delayed" if v.req.delay_ms else ""))
            if v.count_rejected >= 0:
                outcomes.add("count-rejected")
            if v.conn is not None:
                outcomes.add("conn-rejected" if v.conn.rejected >= 0 else "conn-taken" if v.conn.taken else "conn")
            if v.conn is not None and v.conn.taken:
                held.append((route, [verdict.conn for verdict in verdicts]))
            if held and rng.random() < 0.4:
                done_route, decisions = held.pop(rng.randrange(len(held)))
                for store, decision in zip(stores, decisions, strict=True):
                    store.release(done_route, decision)
        # the traffic reached every kind of outcome, so both paths were compared on each
        wanted = {"OK", "OK delayed", "BUSY", "FORBIDDEN", "count-rejected", "conn-rejected", "conn-taken"}
        assert wanted <= outcomes, outcomes
    finally:
        for store in stores:
            await store.close()
