"""The rule two nodes follow when they put back a list Redis lost, whatever their order.

Node A unbanned X just before the loss; node B never heard of it and still holds X. Both
put back what they hold: X must stay unbanned (A's unban is later than X's creation), Y
(held by both) must be in Redis once, and a ban of X made again after the unban must not
be taken for the old one. Real Redis (the session's server, a prefix per test), two
``RedisBans`` that refresh when told to (no background tasks: the order is the test's).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.bans.redis import RedisBans
from gateway.bans.table import Ban, BanList
from gateway.clock import epoch_ms

pytestmark = [pytest.mark.redis]

X, Y = "198.51.100.10/32", "198.51.100.11/32"


def node(client: Any, prefix: bytes) -> RedisBans:
    # A subscriber factory makes it a following node (one that puts back a lost list);
    # the test never starts it, so it only refreshes when told to.
    return RedisBans(client, prefix, BanList(), sync_interval_s=60, subscriber=lambda: None)


async def lose_everything(client: Any, prefix: bytes) -> None:
    keys = [key async for key in client.scan_iter(match=b"*" + prefix + b"*")]
    await client.delete(*keys)


@pytest.mark.parametrize("order", ["holder first", "unbanner first"])
async def test_an_unban_before_the_loss_is_not_undone_by_a_node_that_missed_it(redis_session, order: str) -> None:
    client = aioredis.Redis.from_url(redis_session.url, socket_timeout=5)
    prefix = f"rule{uuid.uuid4().hex[:6]}:".encode()
    try:
        a, b = node(client, prefix), node(client, prefix)
        now = epoch_ms()
        await a.add_many([Ban(X, now + 3_600_000, "x", now, "t"), Ban(Y, 0, "y", now, "t")])
        await a.refresh()
        await b.refresh()
        assert sorted(b.banlist.bans) == [X, Y]
        await a.remove_many([X])  # b does not hear of it: it refreshes only after the loss
        await lose_everything(client, prefix)
        first, second = (b, a) if order == "holder first" else (a, b)
        await first.refresh()
        await second.refresh()
        await first.refresh()  # hears what the second one did
        stored = await client.hgetall(prefix + b"gateway:bans")
        assert sorted(stored) == [Y.encode()]
        assert Ban.from_json(stored[Y.encode()]) == Ban(Y, 0, "y", now, "t")
        assert sorted(a.banlist.bans) == sorted(b.banlist.bans) == [Y]
        assert a.restored_total + b.restored_total == (2 if order == "holder first" else 1)  # Y once, X by b maybe
        assert (a.losses, b.losses) == (1, 1)
    finally:
        await client.aclose()


async def test_a_ban_made_again_after_the_unban_is_put_back(redis_session) -> None:
    client = aioredis.Redis.from_url(redis_session.url, socket_timeout=5)
    prefix = f"rule{uuid.uuid4().hex[:6]}:".encode()
    try:
        a, b = node(client, prefix), node(client, prefix)
        old = epoch_ms() - 10_000
        await a.add_many([Ban(X, 0, "old", old, "t")])
        await a.refresh()
        await a.remove_many([X])
        again = epoch_ms() + 5  # after the unban
        await b.refresh()
        await b.add_many([Ban(X, 0, "again", again, "t")])
        await lose_everything(client, prefix)
        await a.refresh()  # a heard nothing of the new ban: it only knows of its unban
        await b.refresh()
        await a.refresh()
        stored = await client.hgetall(prefix + b"gateway:bans")
        assert Ban.from_json(stored[X.encode()]).reason == "again"
        assert a.banlist.bans[X].reason == b.banlist.bans[X].reason == "again"
    finally:
        await client.aclose()


async def test_nothing_is_put_back_when_nothing_was_lost(redis_session) -> None:
    client = aioredis.Redis.from_url(redis_session.url, socket_timeout=5)
    prefix = f"rule{uuid.uuid4().hex[:6]}:".encode()
    try:
        a = node(client, prefix)
        await a.add_many([Ban(Y, 0, "y", epoch_ms(), "t")])
        await a.refresh()
        version = a.version
        await a.refresh()
        await a.refresh()
        assert (a.losses, a.restored_total, a.version) == (0, 0, version)
    finally:
        await client.aclose()
