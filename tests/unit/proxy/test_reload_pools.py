"""Pools retired by a reload close only when nothing uses them."""

from __future__ import annotations

import asyncio

from gateway.config.upstreams import ServerSpec, UpstreamSpec
from gateway.proxy.upstream import UpstreamPool
from gateway.runtime.server import _close_later


async def test_a_retired_pool_waits_for_its_last_user():
    pool = UpstreamPool(UpstreamSpec(name="app", servers=(ServerSpec(host="127.0.0.1", port=9),)))
    pool.in_flight = 1  # a long download or a WebSocket tunnel
    closing = asyncio.ensure_future(_close_later([pool]))
    await asyncio.sleep(1.2)
    assert not closing.done()
    assert pool.connections.closed  # its idle keep-alive connections go at once
    pool.in_flight = 0
    await asyncio.wait_for(closing, 3)
