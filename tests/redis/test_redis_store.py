"""RedisStore against a real redis-server that the tests pause, kill and restart."""

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
from gateway.store.redis import store as redis_store

CONFIG = """
zones:
  one: {type: req, key: $arg_k, rate: 2r/s, ban: 1s}
  conns: {type: conn, key: $arg_k}
upstreams:
  app: {servers: [127.0.0.1:9]}
routes:
  - {location: /, upstream: app, limit_req: [{zone: one, burst: 1, nodelay: true}]}
  - {location: /c, upstream: app, limit_conn: [{zone: conns, max: 1}]}
"""


async def open_store(url: str, on_error: str = "deny", timeout_ms: int = 50, prefix: str | None = None) -> RedisStore:
    config = load_config_text(CONFIG)
    store = RedisStore(
        RedisSpec(
            url=url,
            timeout_ms=timeout_ms,
            on_error=on_error,  # type: ignore[arg-type]
            prefix=prefix or f"t{uuid.uuid4().hex[:8]}:",
        )
    )
    store.configure(config.spec.zones)
    await store.start()
    store.routes = {r.location.value: r for r in config.routes}  # type: ignore[attr-defined]
    return store


async def admit(store: RedisStore, key: bytes = b"k", location: str = "/"):
    route = store.routes[location]  # type: ignore[attr-defined]
    return await store.admit(route, [key] * len(route.limit_req), [], [key] * len(route.limit_conn))


async def wait_closed(store: RedisStore, limit: float = 3.0) -> float:
    started = time.monotonic()
    while store.breaker.open:
        if time.monotonic() - started > limit:
            raise AssertionError("the circuit did not close")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


@pytest.mark.timing
async def test_a_hung_redis_costs_at_most_the_timeout_then_nothing(redis_server):
    store = await open_store(redis_server.url, timeout_ms=50)
    try:
        assert (await admit(store)).req.rc == nginx_req.OK
        redis_server.pause()  # accepts connections, never answers
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await admit(store)
            assert time.monotonic() - started < 0.15
        assert store.breaker.open
        started = time.monotonic()
        for _ in range(100):  # the breaker is open: no call waits on Redis any more
            with pytest.raises(StoreUnavailable):
                await admit(store)
        assert time.monotonic() - started < 0.05
        redis_server.resume()
        assert await wait_closed(store) < 1.0  # recovered within a second of Redis returning
        # (the two commands that timed out reach Redis when it resumes, and are charged then:
        # that errs on the strict side, and is why a fresh key is used here)
        assert (await admit(store, b"fresh")).req.rc == nginx_req.OK
    finally:
        redis_server.resume()
        await store.close()


async def test_local_fallback_keeps_limiting_while_redis_is_down(redis_server):
    store = await open_store(redis_server.url, on_error="local")
    try:
        redis_server.kill()
        outcomes = [(await admit(store, b"x")).req.rc for _ in range(4)]
        # burst 1: the embedded store still lets two through, rejects the third and bans the key
        assert outcomes == [nginx_req.OK, nginx_req.OK, nginx_req.BUSY, nginx_req.FORBIDDEN]
    finally:
        await store.close()


async def test_scripts_come_back_after_a_restart_without_an_error(redis_server):
    store = await open_store(redis_server.url, on_error="deny", timeout_ms=200)
    try:
        assert (await admit(store, b"a")).req.rc == nginx_req.OK
        redis_server.restart()  # same port, empty script cache and data
        await asyncio.sleep(0.05)
        verdict = await admit(store, b"a")  # NOSCRIPT is handled inside the store
        assert verdict.req.rc == nginx_req.OK
        assert not store.breaker.open
        client = redis.Redis(port=redis_server.port)
        assert int(client.info("commandstats")["cmdstat_script|load"]["calls"]) >= 1  # reloaded
        client.close()
    finally:
        await store.close()


async def test_ban_runs_on_the_redis_clock_and_is_remembered_locally(redis_server):
    store = await open_store(redis_server.url)
    client = redis.Redis(port=redis_server.port)
    try:
        assert [(await admit(store, b"bad")).req.rc for _ in range(3)] == [nginx_req.OK, nginx_req.OK, nginx_req.BUSY]
        calls_before = int(client.info("commandstats")["cmdstat_evalsha"]["calls"])
        for _ in range(50):  # a banned client's flood costs no Redis traffic
            assert (await admit(store, b"bad")).req.rc == nginx_req.FORBIDDEN
        assert int(client.info("commandstats")["cmdstat_evalsha"]["calls"]) == calls_before
        other = await open_store(redis_server.url, prefix=store.spec.prefix)  # another node
        assert (await admit(other, b"bad")).req.rc == nginx_req.FORBIDDEN  # learns it from Redis
        await asyncio.sleep(1.1)
        assert (await admit(store, b"bad")).req.rc == nginx_req.OK
        assert (await admit(other, b"bad")).req.rc == nginx_req.OK
        await other.close()
    finally:
        client.close()
        await store.close()


async def test_conn_leases_of_a_dead_node_run_out_and_live_ones_are_renewed(redis_server, monkeypatch):
    monkeypatch.setattr(redis_store, "LEASE_MS", 600)
    monkeypatch.setattr(redis_store, "RENEW_EVERY_S", 0.15)
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    live = await open_store(redis_server.url, prefix=prefix)
    dead = await open_store(redis_server.url, prefix=prefix)
    try:
        held = (await admit(live, b"u", "/c")).conn
        assert held is not None and held.rejected == -1
        await asyncio.sleep(1.0)  # longer than a lease: renewal keeps the slot
        assert (await admit(dead, b"u", "/c")).conn.rejected == 0
        live.release(live.routes["/c"], held)  # type: ignore[attr-defined]
        await asyncio.sleep(0.05)
        taken = (await admit(dead, b"u", "/c")).conn
        assert taken.rejected == -1
        for task in dead._tasks:  # the node "dies": no release, no renewal
            task.cancel()
        assert (await admit(live, b"u", "/c")).conn.rejected == 0
        await asyncio.sleep(0.7)
        assert (await admit(live, b"u", "/c")).conn.rejected == -1  # freed when its lease ran out
    finally:
        await live.close()
        await dead.close()


async def test_a_long_request_keeps_its_slot_beyond_the_set_expiry(redis_server, monkeypatch):
    monkeypatch.setattr(redis_store, "LEASE_MS", 500)
    monkeypatch.setattr(redis_store, "RENEW_EVERY_S", 0.1)
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    store = await open_store(redis_server.url, prefix=prefix)
    try:
        held = (await admit(store, b"u", "/c")).conn
        assert held is not None and held.rejected == -1
        await asyncio.sleep(1.6)  # over twice the lease: the set's own expiry must be pushed too
        assert (await admit(store, b"u", "/c")).conn.rejected == 0
    finally:
        await store.close()


async def test_a_cancelled_admission_gives_its_slot_back(redis_server):
    store = await open_store(redis_server.url, timeout_ms=500)
    try:
        for _ in range(5):
            task = asyncio.ensure_future(admit(store, b"u", "/c"))
            await asyncio.sleep(0)  # the script call is written, the reply not read yet
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.1)
        decision = (await admit(store, b"u", "/c")).conn
        assert decision.rejected == -1  # max 1: no cancelled request kept the slot
    finally:
        await store.close()


async def test_a_wrong_password_does_not_leak_connections(redis_server):
    server = redis_server
    server.command("CONFIG", "SET", "requirepass", "right")
    url = f"redis://:wrong@127.0.0.1:{server.port}/0"
    store = await open_store(url, on_error="allow", timeout_ms=100)
    try:
        for _ in range(30):
            with pytest.raises(StoreUnavailable):
                await admit(store, b"k")
            await asyncio.sleep(0.02)
        clients = redis.Redis(port=server.port, password="right").info("clients")["connected_clients"]
        assert clients <= 4, clients
    finally:
        await store.close()


async def test_expired_bans_are_deleted_only_if_unchanged(redis_server):
    from gateway.bans.redis import DELETE_IF_UNCHANGED_SCRIPT, script_source

    client = redis.Redis(port=redis_server.port)
    client.hset("bans", mapping={"a": "old", "b": "old"})
    client.hset("bans", "b", "new")  # re-banned after the old value was read
    client.eval(script_source(DELETE_IF_UNCHANGED_SCRIPT), 1, "bans", "a", "old", "b", "old")
    assert client.hgetall("bans") == {b"b": b"new"}
    client.close()


async def test_a_slot_taken_by_the_local_fallback_is_given_back_to_it(redis_server):
    store = await open_store(redis_server.url, on_error="local")
    try:
        redis_server.kill()
        route = store.routes["/c"]  # type: ignore[attr-defined]
        for _ in range(3):  # max 1: each request gets the slot the previous one gave back
            verdict = await admit(store, b"u", "/c")
            assert verdict.conn is not None and verdict.conn.rejected == -1 and verdict.conn.taken
            store.release(route, verdict.conn)
    finally:
        await store.close()
