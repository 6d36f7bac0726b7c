"""The batcher: many requests' decisions per script call, releases riding in the batches.

Each test has its own redis-server and reads what that server executed: INFO
commandstats for the number of script calls, MONITOR for which commands came from
a client (top level) and which from inside the script.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis

from gateway.config.store import RedisSpec
from gateway.errors import StoreUnavailable
from gateway.limits import nginx_req
from gateway.plan import load_config_text
from gateway.store.redis import RedisStore
from tests.support.openresty import Monitor

CONFIG = """
zones:
  req: {type: req, key: $arg_k, rate: 2r/s}
  conns: {type: conn, key: $arg_k}
upstreams:
  app: {servers: [127.0.0.1:9]}
routes:
  - {location: /, upstream: app, limit_req: [{zone: req, burst: 100000, nodelay: true}],
     limit_conn: [{zone: conns, max: 60000}]}
  - {location: /tight, upstream: app, limit_req: [{zone: req, burst: 3, nodelay: true}]}
"""


async def open_store(url: str, timeout_ms: int = 1000) -> RedisStore:
    config = load_config_text(CONFIG)
    store = RedisStore(RedisSpec(url=url, timeout_ms=timeout_ms, on_error="deny", prefix=f"b{uuid.uuid4().hex[:8]}:"))
    store.configure(config.spec.zones)
    await store.start()
    store.routes = {r.location.value: r for r in config.routes}  # type: ignore[attr-defined]
    return store


def script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {"calls": 0})["calls"])


async def test_concurrent_requests_share_script_calls_and_releases_ride_in_them(redis_server):
    store = await open_store(redis_server.url)
    client = redis.Redis(port=redis_server.port)
    monitor = Monitor(redis_server.port)
    route = store.routes["/"]  # type: ignore[attr-defined]
    n = 200
    try:
        before = script_calls(client)

        async def one(i: int) -> None:
            key = b"client%d" % (i % 20)
            verdict = await store.admit(route, [key], [], [key])
            assert verdict.req is not None and verdict.req.rc == nginx_req.OK
            assert verdict.conn is not None and verdict.conn.rejected == -1 and verdict.conn.taken
            await asyncio.sleep(0.001 * (i % 5))  # the request "runs", then gives its slot back
            store.release(route, verdict.conn)

        await asyncio.gather(*(one(i) for i in range(n)))
        await asyncio.sleep(0.1)  # the last releases go out on their own after a short wait
        calls = script_calls(client) - before
        assert 1 <= calls <= n // 4, f"{calls} script calls for {n} requests"
        # every slot was given back
        assert sum(client.zcard(k) for k in client.keys(store.prefix + b"conns:*")) == 0
        time.sleep(0.2)  # MONITOR's stream is read by a thread
        commands = monitor.commands()
    finally:
        monitor.close()
        client.close()
        await store.close()
    top_level = {args[0].upper() for source, args in commands if source != "lua" and args}
    ours = {b"HELLO", b"CLIENT", b"INFO", b"KEYS", b"ZCARD"}  # this test's own client
    assert top_level - ours == {b"EVALSHA"}, top_level  # no ZREM, ZADD or anything else of its own
    inner_zrem = [args for source, args in commands if source == "lua" and args[:1] == [b"ZREM"]]
    assert len(inner_zrem) == n  # each release ran, inside a batch


async def test_a_batch_decides_in_order_like_one_call_per_request(redis_server):
    store = await open_store(redis_server.url)
    client = redis.Redis(port=redis_server.port)
    route = store.routes["/tight"]  # type: ignore[attr-defined]
    try:
        before = script_calls(client)
        verdicts = await asyncio.gather(*(store.admit(route, [b"one"], [], []) for _ in range(10)))
        # burst 3: excess 0, 1, 2, 3 accepted, the fifth and later rejected, in the order asked
        assert [v.req.rc for v in verdicts] == [nginx_req.OK] * 4 + [nginx_req.BUSY] * 6
        assert script_calls(client) - before == 1
    finally:
        client.close()
        await store.close()


@pytest.mark.timing
async def test_a_hung_redis_fails_a_whole_batch_within_one_timeout(redis_server):
    store = await open_store(redis_server.url, timeout_ms=100)
    route = store.routes["/"]  # type: ignore[attr-defined]
    try:
        await store.admit(route, [b"warm"], [], [b"warm"])
        redis_server.pause()
        started = time.monotonic()
        results = await asyncio.gather(
            *(store.admit(route, [b"k%d" % i], [], [b"k%d" % i]) for i in range(50)), return_exceptions=True
        )
        took = time.monotonic() - started
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        assert took < 1.0, took  # one deadline (100 ms) for the batch, not 50 in a row (5 s)
        assert store.breaker.failures == 1 and not store.breaker.open  # one failed call, not 50
        assert store.breaker.calls["timeout"] == 1
    finally:
        redis_server.resume()
        await store.close()


async def test_a_batch_queued_behind_a_late_one_goes_out_without_waiting_for_its_reply(redis_server):
    """A stalled Redis process (SIGSTOP here; a busy core or a fork in life): the batch queued
    behind the one on the wire is sent once that one is late, so both are answered at the
    next wakeup, in order, instead of the second waiting for a round trip of its own."""
    store = await open_store(redis_server.url, timeout_ms=1000)
    route = store.routes["/tight"]  # type: ignore[attr-defined]
    batcher = store.batcher
    try:
        for _ in range(5):  # a recent round trip to judge lateness by
            await store.admit(store.routes["/"], [b"warm"], [], [b"warm"])  # type: ignore[attr-defined]
        assert batcher.late_after() < 0.05
        sent = batcher.batches
        redis_server.pause()
        first = asyncio.ensure_future(store.admit(route, [b"k"], [], []))
        await asyncio.sleep(0.01)  # on the wire, unanswered
        later = [asyncio.ensure_future(store.admit(route, [b"k"], [], [])) for _ in range(4)]
        await asyncio.sleep(0.1)
        assert batcher.batches == sent + 2 and batcher.sent_past_late == 1  # both out, neither answered
        assert not first.done() and not any(f.done() for f in later)
        await asyncio.sleep(0.1)
        assert batcher.batches == sent + 2  # never more than two on the wire
        redis_server.resume()
        verdicts = [await first] + [await f for f in later]
        # one bucket, in the order sent: burst 3 lets the first four through, then refuses
        codes = [v.req.rc for v in verdicts if v.req is not None]
        assert codes == [nginx_req.OK] * 4 + [nginx_req.BUSY], codes
    finally:
        redis_server.resume()
        await store.close()


async def test_under_load_no_batch_is_sent_past_the_one_on_the_wire(redis_server):
    """The late rule must not split batches when Redis keeps up: a round trip under load is
    a loop iteration, and the bar is twice the recent one."""
    store = await open_store(redis_server.url)
    route = store.routes["/"]  # type: ignore[attr-defined]
    try:

        async def one(key: bytes) -> None:
            verdict = await store.admit(route, [key], [], [key])
            assert verdict.conn is not None
            store.release(route, verdict.conn)

        for _ in range(20):
            await asyncio.gather(*(one(b"k%d" % i) for i in range(50)))
        batcher = store.batcher
        assert batcher.sent_past_late <= max(1, batcher.batches // 50)
        assert batcher.operations / batcher.batches > 10
    finally:
        await store.close()


async def test_a_reply_that_came_while_the_loop_was_busy_is_no_timeout(redis_server):
    """A gateway busy past the Redis timeout (its loop blocked, say by a burst of work) must
    not take the reply waiting in its socket for a dead Redis: the event loop runs its timers
    before it polls the sockets, so the deadline is judged after one more poll."""
    store = await open_store(redis_server.url, timeout_ms=50)
    route = store.routes["/"]  # type: ignore[attr-defined]
    counter = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        for _ in range(3):
            await store.batcher.idle()  # the previous round's release is answered
            calls = script_calls(counter)
            admitted = asyncio.ensure_future(store.admit(route, [b"k"], [], [b"k"]))
            for _ in range(3):  # the request queues, its batch goes out
                await asyncio.sleep(0)
            assert store.batcher.batches > 0 and not admitted.done()
            # The loop is blocked past the deadline, and until Redis has run the batch (on a busy
            # machine Redis itself may take longer than the deadline); 5 s at most.
            blocked_from = time.monotonic()
            while time.monotonic() - blocked_from < 0.15 or (
                script_calls(counter) <= calls and time.monotonic() - blocked_from < 5
            ):
                time.sleep(0.01)
            verdict = await admitted
            assert verdict.req is not None and verdict.req.rc == nginx_req.OK
            store.release(route, verdict.conn)
        assert not store.breaker.open and store.breaker.calls["timeout"] == 0
    finally:
        counter.close()
        await store.close()
