"""The master's store served to workers: leases of abandoned calls, errors and reconnection."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.config.units import parse_rate
from gateway.config.zones import ZoneSpec
from gateway.errors import StoreUnavailable
from gateway.http.keys import parse_key
from gateway.plan import load_config_text
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


async def test_the_calls_of_one_tick_share_a_write_and_each_gets_its_own_answer(tmp_path, monkeypatch):
    """Frames queued in one tick go to the master in one write; the master answers one read's
    frames in one write. 200 concurrent admits over 100 keys with max 1: each key's first caller
    holds the slot, its second is refused, and the releases free them all."""
    config, store, server, client = await setup(tmp_path)
    route = config.routes[0]
    assert client._writer is not None
    writes: list[int] = []
    real_write = client._writer.write
    monkeypatch.setattr(client._writer, "write", lambda data: (writes.append(len(data)), real_write(data))[1])
    try:
        keys = [b"k%d" % (i % 100) for i in range(200)]
        verdicts = await asyncio.gather(*(client.admit(route, [], [], [key]) for key in keys))
        assert len(writes) <= 2  # one write for the tick (a DEFINE and 200 ADMITs), not 201
        first, second = verdicts[:100], verdicts[100:]
        assert all(v.conn is not None and v.conn.rejected == -1 and v.conn.taken for v in first)
        assert all(v.conn is not None and v.conn.rejected == 0 and not v.conn.taken for v in second)
        assert len(store.zones["conns"].counts) == 100
        for verdict in first:
            assert verdict.conn is not None
            client.release(route, verdict.conn)
        await asyncio.sleep(0.1)
        assert store.zones["conns"].counts == {}
    finally:
        await client.close()
        await server.close()


async def test_frames_split_across_reads_and_many_to_a_read_are_all_decoded(monkeypatch):
    from gateway.store import shared
    from gateway.store.shared import MAX_FRAME, _frame, _read_frames

    messages = [(2, i, 7, [b"x" * (i * 37)], [], [], []) for i in range(50)]
    data = b"".join(_frame(m) for m in messages)
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    batches = [batch async for batch in _read_frames(reader)]
    assert len(batches) == 1 and batches[0] == messages  # many to a read

    monkeypatch.setattr(shared, "READ_SIZE", 5)  # headers and bodies split anywhere
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    batches = [batch async for batch in _read_frames(reader)]
    assert len(batches) == 50 and [m for batch in batches for m in batch] == messages

    bad = asyncio.StreamReader()
    bad.feed_data((MAX_FRAME + 1).to_bytes(4, "big"))
    bad.feed_eof()
    try:
        async for _ in _read_frames(bad):
            pass
    except ValueError as exc:
        assert "frame of" in str(exc)
    else:
        raise AssertionError("an oversized frame was accepted")


async def test_a_reply_that_came_while_the_worker_was_busy_is_no_timeout(tmp_path):
    """The master (in a thread of its own here, as in its own process in production) answers
    while the worker's loop is blocked past the timeout: the reply is in the worker's socket
    when its timer fires, and it counts (the deadline is judged after one more poll)."""
    import threading
    import time

    config = load_config_text(CONFIG)
    store = MemoryStore()
    store.configure(config.spec.zones)
    path = str(tmp_path / "s.sock")
    master_loop = asyncio.new_event_loop()
    server = SharedStoreServer(store, path)
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(master_loop)
        master_loop.run_until_complete(server.start())
        started.set()
        master_loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(5)
    client = SharedStoreClient(path, timeout=0.05)
    await client.start()
    route = config.routes[0]
    try:
        for _ in range(3):
            admitted = asyncio.ensure_future(client.admit(route, [], [], [b"u"]))
            for _ in range(3):  # the call goes out (frames are written once per tick)
                await asyncio.sleep(0)
            time.sleep(0.15)  # the worker is blocked: the master answers, the deadline passes
            verdict = await admitted
            assert verdict.conn is not None and verdict.conn.rejected == -1
            client.release(route, verdict.conn)
    finally:
        await client.close()

        async def shutdown() -> None:
            await server.close()
            serving = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in serving:
                task.cancel()  # each closes its connection on the way out
            await asyncio.gather(*serving, return_exceptions=True)
            await asyncio.sleep(0.01)  # the transports close

        asyncio.run_coroutine_threadsafe(shutdown(), master_loop).result(5)
        master_loop.call_soon_threadsafe(master_loop.stop)
        thread.join(5)
        master_loop.close()
