"""limit_req's delay on Redis is lua-resty-redis-ratelimit's, from the integer Redis replies.

request.lua (and batch.lua, which runs it) computes each zone's delay from its excess truncated
to an integer, as the library's node receives it, divided in double arithmetic
(``resty_req.delay_ms``); the store reads that reply into the verdict (both the short path and
the general merge). States are written into Redis directly, with ``last`` equal to the call's
``now`` or a chosen number of ms before it: nothing depends on the machine's clock.
"""

from __future__ import annotations

import json
import math
import uuid

import pytest
import redis

from gateway.config.store import RedisSpec
from gateway.limits import nginx_req, resty_req
from gateway.plan import load_config_text
from gateway.store import lua
from gateway.store.redis import RedisStore
from tests.support.conformance import FakeClock

NOW = 1_700_000_000_000
RATES = [16, 50, 116, 500, 1000, 1666, 2000, 3000, 7000, 100000]  # 1r/m 3r/m 7r/m 30r/m ... 100r/s
FRACTIONS = [0.0, 0.25, 0.5, 0.984, 0.999999]


@pytest.fixture(scope="module")
def client(redis_session):
    c = redis.Redis(port=redis_session.port)
    yield c
    c.close()


def request_args(now: int, rate_m: int, burst_m: int, delay_m: int) -> list[object]:
    """request.lua's ARGV for one limit_req zone and nothing else (see its header)."""
    return [now, "m", "", 0, 1, 0, 0, 0, 30000, 0, rate_m, burst_m, delay_m, 0]


@pytest.mark.parametrize("delay_m", [0, 1000, 2**53], ids=["delay0", "delay1", "nodelay"])
def test_request_lua_delay_is_the_librarys(client, delay_m):
    """Every integer excess 1000..3499 (with a fraction) at every rate (every ninth with a delay
    threshold): the reply's excess is the truncated one and its delay is what the library's node
    waits for it."""
    sha = client.script_load(lua.source("request.lua"))
    wholes = range(0, 2500, 1 if delay_m == 0 else 9)
    prefix = f"d{uuid.uuid4().hex}:"
    cases = []
    pipe = client.pipeline(transaction=False)
    for rate_m in RATES:
        for whole in wholes:
            stored = whole + FRACTIONS[whole % len(FRACTIONS)]
            key = f"{prefix}{rate_m}:{whole}"
            pipe.set(key, json.dumps([stored, NOW, 0]))
            pipe.evalsha(sha, 1, key, *request_args(NOW, rate_m, 10**7, delay_m))
            cases.append((rate_m, stored))
    replies = pipe.execute()[1::2]
    float_below_exact = old_differs = 0
    for (rate_m, stored), reply in zip(cases, replies, strict=True):
        excess = stored + 1000  # last == now: no leak, one more request
        whole = resty_req.reply_integer(excess)
        want = resty_req.delay_ms(whole, rate_m, delay_m)
        assert reply[:6] == [1, 0, 0, 0, want, 1], (rate_m, stored)
        assert reply[6] == whole, (rate_m, stored)
        if delay_m == 0:
            float_below_exact += want != whole * 1000 // rate_m
            old_differs += want != math.floor(excess * 1000 / rate_m)
    if delay_m == 0:
        # the grid holds both kinds of case the old rule got wrong
        assert float_below_exact > 0 and old_differs > 0, (float_below_exact, old_differs)
    client.delete(*[f"{prefix}{rate_m}:{w}" for rate_m in RATES for w in wholes])


CONFIG = """
zones:
  slow: {type: req, key: $arg_k, rate: 3r/m}
  seven: {type: req, key: $arg_k, rate: 7r/m}
  third: {type: req, key: $arg_k, rate: 3r/s}
upstreams:
  app: {servers: [127.0.0.1:9]}
routes:
  - {location: /slow, upstream: app, limit_req: [{zone: slow, burst: 5}]}
  - {location: /two, upstream: app, limit_req: [{zone: slow, burst: 5}, {zone: seven, burst: 5}]}
  - {location: /third, upstream: app, limit_req: [{zone: third, burst: 5, delay: 1}]}
"""


@pytest.mark.parametrize("full", [True, False], ids=["short_path", "general_merge"])
async def test_the_store_reads_the_truncated_excess_and_the_librarys_delay(redis_session, client, full):
    config = load_config_text(CONFIG)
    routes = {r.location.value: r for r in config.routes}
    clock = FakeClock()
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    store = RedisStore(
        RedisSpec(url=redis_session.url, timeout_ms=2000, on_error="deny", prefix=prefix), clock_ms=clock
    )
    store.full_calls = full
    store.configure(config.spec.zones)
    await store.start()
    now = clock()

    async def admit(location: str, key: bytes, states: dict[str, list[float]]) -> nginx_req.ReqDecision:
        for zone, state in states.items():
            client.set(f"{prefix}{zone}:".encode() + key, json.dumps(state))
        route = routes[location]
        verdict = await store.admit(route, [key] * len(route.limit_req), [], [])
        assert verdict.req is not None
        return verdict.req

    try:
        # 3r/m (rate_m 50): stored 606.75 -> excess 1606.75, replied 1606: 1606 / 50 s in doubles
        # is 32119 ms; nginx's integer rule would give 32120, the old float floor 32135
        req = await admit("/slow", b"a", {"slow": [606.75, now, 0]})
        assert (req.rc, req.excess, req.excesses, req.delay_ms) == (nginx_req.OK, 1606, [1606], 32119)
        stored = json.loads(client.get(f"{prefix}slow:a") or b"null")
        assert stored == [1606.75, now, 0]  # the fraction stays in Redis; only the reply is truncated

        # 1 s of leak at 3r/m is 50 m-req: 1500.5 - 50 + 1000 = 2450.5, replied 2450, 49000 ms
        req = await admit("/slow", b"b", {"slow": [1500.5, now - 1000, 0]})
        assert (req.excess, req.delay_ms) == (2450, 49000)

        # two zones: each zone's delay is the library's, the longest wins (nginx's rule for several)
        # slow: 1606 / 50 -> 32119; seven (rate_m 116): 2999.9 + 1000 -> 3999 / 116 s -> 34474 ms
        req = await admit("/two", b"c", {"slow": [606.75, now, 0], "seven": [2999.9, now, 0]})
        assert req.excesses == [1606, 3999]
        assert (req.index, req.excess, req.delay_ms) == (1, 3999, resty_req.delay_ms(3999, 116))
        assert req.delay_ms == 34474

        # delay=1 at 3r/s: (2333 - 1000) / 3000 s = 444.33 ms -> 444
        req = await admit("/third", b"d", {"third": [1333.9, now, 0]})
        assert (req.excess, req.delay_ms) == (2333, 444)
    finally:
        await store.close()
