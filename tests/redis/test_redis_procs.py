"""Self-test of tests/support/redis_procs.py: every helper against real redis-server processes."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator

import pytest
import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff, NoBackoff

from tests.support.ports import CLUSTER_BUS_OFFSET, free_port, port_is_free
from tests.support.redis_procs import (
    CLUSTER_SLOTS,
    RedisCluster,
    RedisReplyError,
    RedisSentinelSet,
    RedisServer,
    RedisStartError,
    key_slot,
    pairs_to_dict,
    require_redis_binaries,
)

NO_RETRY = Retry(NoBackoff(), 0)


# This module's own cluster and sentinel set (module-scoped), so that the failovers and node
# kills below never touch the session-wide ``redis_cluster`` / ``redis_sentinel`` of tests/conftest.py.
@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    require_redis_binaries()
    cluster = RedisCluster(3, 0, base_dir=tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def own_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelSet]:
    require_redis_binaries()
    sentinels = RedisSentinelSet(1, base_dir=tmp_path_factory.mktemp("redis-sentinel"))
    try:
        yield sentinels.start()
    finally:
        sentinels.close()


FAILOVER_RETRY = Retry(ExponentialBackoff(cap=0.2, base=0.02), 3)
SUM_SCRIPT = "return redis.call('INCRBY', KEYS[1], ARGV[1]) + redis.call('INCRBY', KEYS[2], ARGV[1])"


# --------------------------------------------------------------------------- ports


def test_free_port_with_cluster_bus() -> None:
    ports = [free_port(cluster_bus=True) for _ in range(20)]
    assert len(set(ports)) == 20, "a port was handed out twice"
    for port in ports:
        assert port != 6379
        assert port + CLUSTER_BUS_OFFSET < 65536
        assert port_is_free(port) and port_is_free(port + CLUSTER_BUS_OFFSET)


def test_port_is_free_sees_listeners() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not port_is_free(sock.getsockname()[1])


# --------------------------------------------------------------------------- standalone


async def test_standalone_ping_set_get(redis_server: RedisServer) -> None:
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    assert redis_server.port != 6379 and redis_server.is_running
    client = aioredis.from_url(redis_server.url, socket_timeout=2)
    try:
        assert await client.ping() is True
        assert await client.set("k", "v") is True
        assert await client.get("k") == b"v"
        info = await client.info("server")
        assert info["process_id"] == redis_server.pid  # it is our child, not someone else's Redis
    finally:
        await client.aclose()


async def test_kill_and_restart_on_same_port(redis_server: RedisServer) -> None:
    port = redis_server.port
    assert redis_server.command("SET", "survives?", "no") == "OK"
    old_pid = redis_server.pid

    redis_server.kill()
    assert not redis_server.is_running
    with pytest.raises(ConnectionRefusedError):
        redis_server.command("PING", timeout=0.5)

    redis_server.restart()
    assert redis_server.is_running and redis_server.port == port and redis_server.pid != old_pid
    client = aioredis.from_url(redis_server.url, socket_timeout=2)
    try:
        assert await client.ping() is True
        assert await client.get("survives?") is None  # no persistence: data is gone
    finally:
        await client.aclose()


@pytest.mark.timing
async def test_pause_times_out_and_resume_recovers(redis_server: RedisServer) -> None:
    client = aioredis.Redis(host=redis_server.host, port=redis_server.port, socket_timeout=0.2, retry=NO_RETRY)
    try:
        await client.set("k", "1")
        redis_server.pause()
        assert redis_server.is_paused and redis_server.is_running
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.get("k")
        assert time.monotonic() - started < 1.0
        # A brand-new connection is accepted by the kernel but never answered either.
        fresh = aioredis.Redis(host=redis_server.host, port=redis_server.port, socket_timeout=0.2, retry=NO_RETRY)
        try:
            with pytest.raises(redis.exceptions.TimeoutError):
                await fresh.ping()
        finally:
            await fresh.aclose()

        redis_server.resume()
        assert not redis_server.is_paused
        assert await client.get("k") == b"1"
    finally:
        await client.aclose()


@pytest.mark.timing
def test_stop_paused_server_is_quick(redis_server_factory: Callable[..., RedisServer]) -> None:
    server = redis_server_factory()
    server.pause()
    started = time.monotonic()
    server.stop()
    assert not server.is_running
    assert time.monotonic() - started < 3


def test_startup_failure_raises_with_log() -> None:
    require_redis_binaries()
    server = RedisServer(args=["--no-such-directive", "x"], startup_timeout=5)
    try:
        with pytest.raises(RedisStartError) as err:
            server.start()
        assert "no-such-directive" in str(err.value)  # redis-server's own complaint, from the log
        assert not server.is_running
    finally:
        server.close()
    assert not server.dir.exists()  # private temp dir removed


def test_taken_port_moves_to_a_free_one() -> None:
    require_redis_binaries()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = RedisServer()
        server.port = taken  # as if someone grabbed the probed port before redis-server bound it
        try:
            server.start()
            assert server.port != taken and server.ping()
        finally:
            server.close()


# --------------------------------------------------------------------------- cluster


def test_cluster_topology(own_cluster: RedisCluster) -> None:
    assert len(own_cluster.masters) == 3 and own_cluster.replicas == []
    assert len(own_cluster.seed_urls) == 3
    owners = {own_cluster.node_for_slot(s).port for s in (0, 8000, CLUSTER_SLOTS - 1)}
    assert len(owners) == 3  # redis-cli splits 0..16383 evenly over the 3 masters
    for node in own_cluster.nodes:
        info = node.command("CLUSTER", "INFO")
        assert "cluster_state:ok" in info and f"cluster_slots_ok:{CLUSTER_SLOTS}" in info
    assert key_slot("{t}a") == key_slot("{t}b") == own_cluster.nodes[0].command("CLUSTER", "KEYSLOT", "t")


async def test_cluster_eval_hash_tag_and_crossslot(own_cluster: RedisCluster) -> None:
    own_cluster.flushall()
    rc = AsyncRedisCluster.from_url(own_cluster.seed_urls[0], socket_timeout=2)
    try:
        assert await rc.eval(SUM_SCRIPT, 2, "{t}a", "{t}b", 5) == 10
        # redis-py refuses cross-slot EVAL before sending it ...
        with pytest.raises(redis.exceptions.RedisClusterException, match="same key slot"):
            await rc.eval(SUM_SCRIPT, 2, "a", "b", 5)
    finally:
        await rc.aclose()
    # ... and the server answers CROSSSLOT when it gets one.
    assert key_slot("a") != key_slot("b")
    owner = own_cluster.node_for_key("a")
    with pytest.raises(RedisReplyError, match="CROSSSLOT"):
        owner.command("EVAL", SUM_SCRIPT, 2, "a", "b", 5)
    node_client = aioredis.from_url(owner.url, socket_timeout=2)
    try:
        # redis-py maps the "CROSSSLOT" error code to its own class (and strips the code).
        with pytest.raises(redis.exceptions.ClusterCrossSlotError, match="same slot"):
            await node_client.eval(SUM_SCRIPT, 2, "a", "b", 5)
    finally:
        await node_client.aclose()


async def test_cluster_client_set_get_across_slots(own_cluster: RedisCluster) -> None:
    keys = [f"key:{i}" for i in range(30)]
    owners = {own_cluster.node_for_key(k).port for k in keys}
    assert len(owners) == 3, "keys should span every master"
    rc = AsyncRedisCluster.from_url(own_cluster.seed_urls[-1], socket_timeout=2)
    try:
        for k in keys:
            assert await rc.set(k, k.upper()) is True
        for k in keys:
            assert await rc.get(k) == k.upper().encode()
    finally:
        await rc.aclose()
    for k in keys[:5]:  # and they really live on the owning master
        assert own_cluster.node_for_key(k).command("GET", k) == k.upper()


def test_cluster_kill_and_restart_node(own_cluster: RedisCluster) -> None:
    victim = own_cluster.node_for_key("{t}a")
    try:
        own_cluster.kill_node(victim)
        assert not victim.is_running
        with pytest.raises(TimeoutError):
            own_cluster.wait_ok(timeout=0.5)  # no replica: its slots stay down
        own_cluster.restart_node(victim)  # rejoins from nodes.conf, waits for state ok
        assert victim in own_cluster.masters
        assert victim.command("GET", "{t}a") is None  # data gone with the crash
    finally:
        own_cluster.heal()


async def test_cluster_with_replicas_fails_over(tmp_path_factory: pytest.TempPathFactory) -> None:
    require_redis_binaries()
    # node_timeout_ms=1000 (default 2000) roughly halves the time to fail over.
    with RedisCluster(3, 1, base_dir=tmp_path_factory.mktemp("rc-repl"), node_timeout_ms=1000) as cluster:
        assert len(cluster.masters) == 3 and len(cluster.replicas) == 3
        rc = AsyncRedisCluster.from_url(cluster.seed_urls[0], socket_timeout=1)
        try:
            victim = cluster.node_for_key("{t}a")
            # WAIT only counts acks for its own connection's writes: same connection.
            assert victim.pipeline(("SET", "{t}a", "1"), ("WAIT", 1, 2000)) == ["OK", 1]
            cluster.kill_node(victim)
            await asyncio.to_thread(cluster.wait_ok, 20)  # the replica takes over the slots
            promoted = cluster.node_for_key("{t}a")
            assert promoted is not victim and promoted in cluster.masters
            assert promoted.command("GET", "{t}a") == "1"

            cluster.restart_node(victim)  # rejoins as a replica of the promoted node
            assert victim in cluster.replicas and victim.info("replication")["master_port"] == str(promoted.port)
        finally:
            await rc.aclose()


# --------------------------------------------------------------------------- sentinel


async def _sentinel_client(sentinels: RedisSentinelSet) -> tuple[Sentinel, aioredis.Redis]:
    # socket_timeout must exceed the WAIT timeouts used below. Connections made by
    # master_for() default to Retry(NoBackoff(), 0); give them a short retry policy.
    sentinel = Sentinel(sentinels.sentinel_addresses, socket_timeout=0.5)
    master = sentinel.master_for(sentinels.master_name, socket_timeout=3, retry=FAILOVER_RETRY)
    return sentinel, master


async def _set_and_wait(client: aioredis.Redis, key: str, value: str) -> bool:
    """SET, then WAIT for one replica ack on the same connection (WAIT only counts
    its own connection's writes, so the two go in one pipeline)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.set(key, value)
        pipe.execute_command("WAIT", 1, 2000)
        result = await pipe.execute()
    return bool(result == [True, 1])


async def _set_after_failover(client: aioredis.Redis, key: str, value: str) -> bool:
    """SET through a master_for() client whose pooled connection may still point at
    the old master. redis-py 8.1 (redis/redis-py#3874): the in-call retries after
    "The previous master is now a slave" reconnect to the *old* address, so that
    one command fails with ConnectionError; the next one re-resolves via Sentinel."""
    try:
        return bool(await client.set(key, value))
    except redis.exceptions.ConnectionError:
        return bool(await client.set(key, value))


async def test_sentinel_master_for(own_sentinel: RedisSentinelSet) -> None:
    assert own_sentinel.master_name == "mymaster"
    sentinel, master = await _sentinel_client(own_sentinel)
    try:
        assert await sentinel.discover_master("mymaster") == own_sentinel.master.address
        assert await _set_and_wait(master, "hello", "world")  # reached the replica
        (replica,) = own_sentinel.replicas
        assert replica.command("GET", "hello") == "world"
    finally:
        await master.aclose()
        await sentinel.aclose()


async def test_sentinel_planned_failover(own_sentinel: RedisSentinelSet) -> None:
    sentinel, master = await _sentinel_client(own_sentinel)
    try:
        assert await _set_and_wait(master, "before", "1")
        old = own_sentinel.master
        new = await asyncio.to_thread(own_sentinel.failover)
        assert new is not old and new is own_sentinel.master
        assert own_sentinel.master_address() == new.address
        assert old.info("replication")["role"] == "slave"

        assert await _set_after_failover(master, "after", "2")  # same client object keeps working
        assert await master.get("before") == b"1"
        assert new.command("GET", "after") == "2"  # the write went to the new master
        assert await sentinel.discover_master("mymaster") == new.address
    finally:
        await master.aclose()
        await sentinel.aclose()


async def test_sentinel_unplanned_failover(own_sentinel: RedisSentinelSet) -> None:
    sentinel, master = await _sentinel_client(own_sentinel)
    try:
        assert await _set_and_wait(master, "k", "v")
        dead = own_sentinel.kill_master()
        new = await asyncio.to_thread(own_sentinel.wait_for_promotion, dead, 20)
        assert new is not dead and not dead.is_running
        assert await master.get("k") == b"v"  # replicated before the crash
        assert await _set_after_failover(master, "k2", "v2")
        assert new.command("GET", "k2") == "v2"
    finally:
        await master.aclose()
        await sentinel.aclose()
    own_sentinel.heal()  # the crashed node comes back as a replica
    assert dead.is_running and dead in own_sentinel.replicas
    assert dead.info("replication")["master_port"] == str(new.port)


def test_three_sentinels_failover(tmp_path_factory: pytest.TempPathFactory) -> None:
    require_redis_binaries()
    with RedisSentinelSet(3, base_dir=tmp_path_factory.mktemp("s3")) as s3:
        assert s3.quorum == 2 and len(s3.sentinel_addresses) == 3
        for s in s3.sentinels:
            state = pairs_to_dict(s.command("SENTINEL", "MASTER", "mymaster"))
            assert state["num-other-sentinels"] == "2"
        old = s3.master
        new = s3.failover()
        assert new is not old
        assert {s3.master_addr_from(s) for s in s3.sentinels} == {new.address}
    assert not any(p.is_running for p in [*s3.sentinels, *s3.data_nodes])
