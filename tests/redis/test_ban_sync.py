"""How a node follows the shared ban list in a real Redis: versions, change log, expiry index."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.bans.redis import RedisBans
from gateway.bans.table import Ban, BanList
from gateway.clock import epoch_ms
from tests.support.ban_lists import mixed_blocklist
from tests.support.ports import free_port


def client_for(url: str) -> Any:
    return aioredis.Redis.from_url(url, socket_timeout=5)


def bans_for(targets: list[str], reason: str = "feed", until_ms: int = 0) -> list[Ban]:
    now = epoch_ms()
    return [Ban(t, until_ms, reason, now, "test") for t in targets]


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture
async def shared(redis_session):  # type: ignore[no-untyped-def]
    """A writer (what the CLI uses) and a prefix of its own in the session's redis-server."""
    prefix = f"sync{uuid.uuid4().hex[:6]}:".encode()
    client = client_for(redis_session.url)
    writer = RedisBans(client, prefix, BanList(), sync_interval_s=60)
    yield writer
    await client.aclose()


async def test_a_node_reads_only_what_changed_and_nothing_when_nothing_did(shared, redis_session):
    client = client_for(redis_session.url)
    node = RedisBans(client, shared.key[: -len(b"gateway:bans")], BanList(), sync_interval_s=60)
    await shared.add_many(bans_for(mixed_blocklist(3000, seed=1)))
    await node.refresh()
    assert (len(node.banlist), node.full_syncs, node.version) == (3000, 1, 6)  # 6 batches of 500
    extra = mixed_blocklist(3100, seed=1)[3000:]
    await shared.add_many(bans_for(extra, reason="later"))
    await shared.remove_many(mixed_blocklist(3000, seed=1)[:10])
    await node.refresh()
    assert node.full_syncs == 1  # caught up from the log
    assert len(node.banlist) == 3090 and node.banlist.bans[extra[0]].reason == "later"
    scans = await command_calls(client, "hscan")
    await node.refresh()  # nothing changed: one GET, no scan
    assert await command_calls(client, "hscan") == scans and node.version == 8
    await client.aclose()


async def command_calls(client: Any, name: str) -> int:
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))


async def test_a_node_that_missed_more_than_the_log_holds_reads_everything_again(shared, redis_session):
    client = client_for(redis_session.url)
    node = RedisBans(client, shared.key[: -len(b"gateway:bans")], BanList(), sync_interval_s=60)
    await shared.add_many(bans_for(["192.0.2.1/32", "192.0.2.2/32"]))
    await node.refresh()
    await shared.remove_many(["192.0.2.1/32"])
    await shared.add_many(bans_for(["192.0.2.3/32"]))
    await client.xtrim(shared.log_key, maxlen=1, approximate=False)  # the log moved on without this node
    await node.refresh()
    assert node.full_syncs == 2
    assert sorted(node.banlist.bans) == ["192.0.2.2/32", "192.0.2.3/32"]
    await client.aclose()


async def test_ended_bans_leave_redis_through_the_expiry_index_and_every_follower_hears_it(shared, redis_session):
    follower_client = client_for(redis_session.url)
    prefix = shared.key[: -len(b"gateway:bans")]
    follower = RedisBans(
        follower_client,
        prefix,
        BanList(),
        sync_interval_s=60,
        subscriber=lambda: aioredis.Redis.from_url(redis_session.url),
    )
    await follower.start()
    try:
        await until(lambda: follower.version is not None)
        soon = epoch_ms() + 300
        await shared.add_many(bans_for(["198.51.100.7/32"], until_ms=soon) + bans_for(["198.51.100.8/32"]))
        await until(lambda: len(follower.banlist) == 2)
        assert await shared.expire() == 0  # not yet
        await asyncio.sleep(max(0, soon - epoch_ms()) / 1000 + 0.05)
        assert await shared.expire() == 1
        await until(lambda: sorted(follower.banlist.bans) == ["198.51.100.8/32"])
        assert await shared.client.hkeys(shared.key) == [b"198.51.100.8/32"]
        assert await shared.client.zcard(shared.expiry_key) == 0
    finally:
        await follower.close()
        await follower_client.aclose()


async def test_new_bans_arrive_by_pubsub_even_while_reading_the_list_fails(shared, redis_session, caplog):
    dead = aioredis.Redis(host="127.0.0.1", port=free_port(), socket_timeout=0.2, socket_connect_timeout=0.2)
    follower = RedisBans(
        dead,
        shared.key[: -len(b"gateway:bans")],
        BanList(),
        sync_interval_s=0.2,
        subscriber=lambda: aioredis.Redis.from_url(redis_session.url),
    )
    await follower.start()
    try:
        await asyncio.sleep(0.3)  # let it subscribe (and fail its first read)
        await shared.add_many(bans_for(["203.0.113.9/32"]))
        await until(lambda: "203.0.113.9/32" in follower.banlist.bans)
        await until(lambda: bool(follower.status()["last_sync_error"]))
        assert follower.version is None
        # an attacker with access to the channel: garbage is ignored, the next change still lands
        with caplog.at_level(logging.WARNING):
            # a JSON object is not a message either (there is one format, with a version)
            unversioned = {"op": "add", "ban": {"target": "203.0.113.11/32", "until_ms": 0, "reason": "x"}}
            junk_messages = (b"", b"x\n[", b"7\n[1,2]", b'9\n[{"target": "not-a-cidr"}]\n', b"\xff" * 100)
            for junk in (*junk_messages, json.dumps(unversioned).encode()):
                await shared.client.publish(shared.channel, junk)
            await shared.add_many(bans_for(["203.0.113.10/32"]))
            await until(lambda: "203.0.113.10/32" in follower.banlist.bans)
        assert "not-a-cidr" not in follower.banlist.bans
        assert "203.0.113.11/32" not in follower.banlist.bans
    finally:
        await follower.close()
        await dead.aclose()


async def test_changes_made_during_a_long_read_are_not_lost(shared, redis_session):
    targets = mixed_blocklist(30_000, seed=4)
    await shared.add_many(bans_for(targets))
    client = client_for(redis_session.url)
    follower = RedisBans(
        client,
        shared.key[: -len(b"gateway:bans")],
        BanList(),
        sync_interval_s=60,
        subscriber=lambda: aioredis.Redis.from_url(redis_session.url),
    )
    await follower.start()
    try:
        await until(lambda: 1000 < len(follower.banlist) < 25_000, timeout=10)  # in the middle of the read
        await shared.remove_many(targets[-5:] + targets[:5])
        await shared.add_many(bans_for(["203.0.113.77/32"], reason="during"))
        await until(lambda: follower.version is not None and follower.version >= 62, timeout=10)
        assert set(follower.banlist.bans) == {t.decode() for t in await shared.client.hkeys(shared.key)}
        assert follower.banlist.bans["203.0.113.77/32"].reason == "during"
    finally:
        await follower.close()
        await client.aclose()


async def test_the_ban_keys_share_one_slot_on_a_redis_cluster(redis_cluster):
    from gateway.config.store import RedisSpec
    from gateway.store.redis import connect

    spec = RedisSpec(cluster=tuple(redis_cluster.seed_urls))
    prefix = f"clu{uuid.uuid4().hex[:6]}:".encode()
    writer_client, node_client = connect(spec, 5.0), connect(spec, 5.0)
    writer = RedisBans(writer_client, prefix, BanList(), sync_interval_s=60)
    node = RedisBans(node_client, prefix, BanList(), sync_interval_s=60, subscriber=lambda: connect(spec, None))
    await node.start()
    try:
        await until(lambda: node.version is not None)
        targets = mixed_blocklist(2000, seed=11)
        await writer.add_many(bans_for(targets, until_ms=epoch_ms() + 200))
        await until(lambda: len(node.banlist) == 2000)  # by pub/sub, across the cluster
        assert sorted(await writer.remove_many(targets[:3])) == sorted(targets[:3])
        await asyncio.sleep(0.25)
        assert await writer.expire() == 1000  # a sweep is bounded; the next one takes the rest
        assert await writer.expire() == 997
        await until(lambda: len(node.banlist) == 0)
        await node.refresh()
        assert node.full_syncs == 1 and node.version == 7  # 4 batches of 500, 1 removal, 2 sweeps
    finally:
        await node.close()
        await writer_client.aclose()
        await node_client.aclose()
