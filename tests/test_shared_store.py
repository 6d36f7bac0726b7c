"""The master's store served to workers: leases of abandoned calls, errors and reconnection."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.config import load_config_text
from gateway.config.schema import ZoneSpec
from gateway.config.units import parse_rate
from gateway.errors import StoreUnavailable
from gateway.keys import parse_key
from gateway.store.memory import MemoryStore
from gateway.store.shared import SharedStoreClient, SharedStoreServer

CONFIG = """
zones:
  conns: {type: conn, key: $arg_u}
upstreams: {app: {servers: [127.0.0.1:9]}}
routes:
  - {location: /, upstream: app, limit_conn: [{zone: conns, max: 1}]}
"""


async def setup(tmp_path: Path, text: str = CONFIG):
    config = load_config_text(text)
    store = MemoryStore()
    store.configure(config.spec.zones)
    server = SharedStoreServer(store, str(tmp_path / "s.sock"))
    await server.start()
    client = SharedStoreClient(str(tmp_path / "s.sock"))
    await client.start()
    return config, store, server, client


async def test_a_cancelled_call_releases_the_slot_it_was_granted(tmp_path):
    config, store, server, client = await setup(tmp_path)
    route = config.routes[0]
    try:
        for _ in range(5):
            task = asyncio.ensure_future(client.admit(route, [], [], [b"u"]))
            await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.1)
        assert store.zones["conns"].counts == {}
        verdict = await client.admit(route, [], [], [b"u"])
        assert verdict.conn is not None and verdict.conn.rejected == -1
    finally:
        await client.close()
        await server.close()


async def test_a_bad_request_gets_an_error_and_the_connection_survives(tmp_path):
    config, store, server, client = await setup(tmp_path)
    route = config.routes[0]
    try:
        req = ZoneSpec(name="conns", type="req", key=parse_key("$arg_u"), rate=parse_rate("1r/s"))
        store.configure({"conns": req})
        try:
            await client.admit(route, [], [], [b"u"])  # the zone changed type under a reload
            raise AssertionError("expected StoreUnavailable")
        except StoreUnavailable:
            pass
        store.configure(config.spec.zones)
        verdict = await client.admit(route, [], [], [b"u"])
        assert verdict.conn is not None and verdict.conn.rejected == -1
    finally:
        await client.close()
        await server.close()


async def test_the_worker_reconnects_after_losing_the_master(tmp_path):
    config, _store, server, client = await setup(tmp_path)
    route = config.routes[0]
    try:
        for writer in list(server._writers):
            writer.close()  # the connection drops
        await asyncio.sleep(0.3)
        verdict = await client.admit(route, [], [], [b"v"])
        assert verdict.conn is not None and verdict.conn.rejected == -1
    finally:
        await client.close()
        await server.close()
