"""proxy_request_buffering and proxy_buffering, end to end: a slow client must not hold upstream connections.

The upstreams here are raw asyncio servers in a thread, so that the test sees what an
upstream sees: connections accepted, when it finished writing, when the gateway let go.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import zlib
from pathlib import Path

import aiohttp
import pytest

from gateway.errors import ConfigErrors
from gateway.plan import load_config_text
from tests.support.config import basic_config
from tests.support.gateway import Gateway, temp_fds
from tests.support.upstreams import CountingUpstream, Handler, pattern

MiB = 1024**2
GiB = 1024**3


async def echo_length(up: CountingUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every request with the size and checksum of its body, on a keep-alive connection."""
    while True:
        try:
            head, body = await up.read_request(reader)
        except asyncio.IncompleteReadError:
            return
        up.bodies.append(head + body)
        text = f"{len(body)} {zlib.adler32(body)}".encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text))
        await writer.drain()


def big_response(size: int, extra_header: bytes = b"") -> Handler:
    """One response of ``size`` pattern bytes; then waits for the gateway to close (keepalive 0)."""

    async def handle(up: CountingUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (size, extra_header))
        block = pattern(MiB)
        for offset in range(0, size, MiB):
            writer.write(block[: min(MiB, size - offset)])
            await writer.drain()
        up.finished_at.append(time.monotonic())
        await reader.read()  # b"" when the gateway closes its end
        up.eof_at.append(time.monotonic())

    return handle


async def read_then_close(up: CountingUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Takes the whole request, then closes without an answer (a crash after the request was sent)."""
    head, body = await up.read_request(reader)
    up.bodies.append(head + body)


def config(port: int, servers: list[str], *settings: str, top: str = "", keepalive: int = 32) -> str:
    text = basic_config(port, servers).replace(
        "    read_timeout: 2s\n", f"    read_timeout: 5s\n    keepalive: {keepalive}\n"
    )
    top += "admin: {listen: off}\nlog: {level: info}\n"
    return top + text + "".join(f"    {line}\n" for line in settings)


async def temp_files_gone(gw: Gateway, temp_dir: Path, within: float = 2.0) -> bool:
    """The gateway closes a response's temp file when it has written the last byte: the
    client may see that byte a moment before."""
    deadline = time.monotonic() + within
    while temp_fds(gw, temp_dir):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def open_request(port: int, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    return reader, writer


# -- request buffering -------------------------------------------------------------------------


async def test_500_trickling_bodies_hold_no_upstream_connection(gateway_factory):
    with CountingUpstream(echo_length) as up:
        # 500 clients from one address: lift the per-address connection cap, which is not under test here.
        gw = gateway_factory(
            lambda p: config(p, [up.address], "client_body_timeout: 10s", top="max_connections_per_ip: 0\n")
        )
        head = b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"
        clients = await asyncio.gather(*(open_request(gw.port, head) for _ in range(500)))
        for _ in range(3):  # a byte a second from each client, like an attacker holding connections
            for _, writer in clients:
                writer.write(b"a")
            await asyncio.sleep(1)
            assert up.accepted == 0
        for _, writer in clients:
            writer.write(b"bc")
        replies = await asyncio.gather(*(asyncio.wait_for(reader.read(), 20) for reader, _ in clients))
        for _, writer in clients:
            writer.close()
    bad = [
        reply[:120]
        for reply in replies
        if not (reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"5 %d" % zlib.adler32(b"aaabc")))
    ]
    assert not bad, (len(bad), bad[:3], gw.stderr()[-1500:])
    assert up.accepted > 0


async def test_with_request_buffering_off_trickling_bodies_do_hold_upstream_connections(gateway_factory):
    with CountingUpstream(echo_length) as up:
        gw = gateway_factory(lambda p: config(p, [up.address], "proxy_request_buffering: off"))
        head = b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\na"
        clients = await asyncio.gather(*(open_request(gw.port, head) for _ in range(20)))
        deadline = time.monotonic() + 5
        while up.accepted < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert up.accepted == 20  # the behaviour request buffering exists to prevent
        for _, writer in clients:
            writer.write(b"bcde")
        replies = await asyncio.gather(*(asyncio.wait_for(reader.read(), 10) for reader, _ in clients))
        for _, writer in clients:
            writer.close()
    assert all(reply.startswith(b"HTTP/1.1 200") for reply in replies)


async def test_a_body_beyond_client_body_buffer_size_goes_to_an_anonymous_temp_file(gateway_factory, tmp_path):
    temp_dir = tmp_path / "bodies"
    temp_dir.mkdir()
    body = pattern(3 * MiB)
    with CountingUpstream(echo_length) as up:
        gw = gateway_factory(
            lambda p: config(p, [up.address], "client_max_body_size: 0", top=f"temp_path: {temp_dir}\n")
        )
        # chunked from the client, so the gateway counts it; it must reach the upstream with a Content-Length
        reader, writer = await open_request(
            gw.port, b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        writer.write(b"%x\r\n%s\r\n" % (2 * MiB, body[: 2 * MiB]))
        await writer.drain()
        deadline = time.monotonic() + 5
        while not temp_fds(gw, temp_dir) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        open_files = temp_fds(gw, temp_dir)
        assert open_files and all(f.endswith("(deleted)") for f in open_files), open_files
        assert os.listdir(temp_dir) == []  # unlinked from the start: nothing to leave behind
        assert up.accepted == 0
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (MiB, body[2 * MiB :]))
        reply = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert reply.startswith(b"HTTP/1.1 200")
    assert reply.endswith(b"%d %d" % (len(body), zlib.adler32(body)))
    sent_head = up.bodies[0].split(b"\r\n\r\n")[0].lower()
    assert b"content-length: %d" % len(body) in sent_head and b"transfer-encoding" not in sent_head
    assert temp_fds(gw, temp_dir) == []


@pytest.mark.timing
async def test_client_body_deadline_bounds_the_whole_body(gateway_factory):
    with CountingUpstream(echo_length) as up:
        gw = gateway_factory(lambda p: config(p, [up.address], "client_body_timeout: 5s", "client_body_deadline: 1s"))
        reader, writer = await open_request(gw.port, b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        started = time.monotonic()

        async def trickle() -> None:
            for _ in range(50):  # each byte well inside client_body_timeout
                writer.write(b"a")
                await asyncio.sleep(0.1)

        dripping = asyncio.ensure_future(trickle())
        reply = await asyncio.wait_for(reader.read(65536), 5)
        elapsed = time.monotonic() - started
        dripping.cancel()
        writer.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert 0.9 < elapsed < 2.5
    assert up.accepted == 0
    assert "client did not send the whole body within 1s" in gw.stderr()


async def test_expect_100_continue_is_answered_before_the_body_is_read(gateway_factory):
    with CountingUpstream(echo_length) as up:
        gw = gateway_factory(lambda p: config(p, [up.address]))
        reader, writer = await open_request(
            gw.port, b"PUT /up HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert up.accepted == 0
        writer.write(b"data")
        reply = await asyncio.wait_for(reader.readuntil(b"4 %d" % zlib.adler32(b"data")), 5)
        writer.close()
    assert reply.startswith(b"HTTP/1.1 200")
    assert b"expect" not in up.bodies[0].lower()


async def test_413_for_a_counted_body_before_any_upstream_connection(gateway_factory):
    with CountingUpstream(echo_length) as up:
        gw = gateway_factory(lambda p: config(p, [up.address], "client_max_body_size: 1k"))
        reader, writer = await open_request(
            gw.port,
            b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + b"z" * 2048 + b"\r\n",
        )
        reply = await asyncio.wait_for(reader.read(65536), 5)
        writer.close()
    assert reply.startswith(b"HTTP/1.1 413")
    assert up.accepted == 0


@pytest.mark.parametrize(("method", "retried"), [("PUT", True), ("POST", False)])
async def test_a_buffered_idempotent_request_is_retried_after_it_was_sent(gateway_factory, upstream, method, retried):
    with CountingUpstream(read_then_close) as broken:
        gw = gateway_factory(lambda p: config(p, [broken.address, upstream.address]))
        body = pattern(100_000)
        async with aiohttp.ClientSession() as session:
            async with session.request(method, gw.url + "/echo", data=body) as resp:
                status = resp.status
                result = await resp.json() if status == 200 else None
    assert broken.bodies and broken.bodies[0].endswith(body)  # the first server did get it whole
    if retried:
        assert status == 200
        assert result is not None and result["body_bytes"] == len(body)
        assert result["adler32"] == zlib.adler32(body)
    else:
        assert status == 502
        assert upstream.seen == []  # not replayed: it may have taken effect


@pytest.mark.parametrize("request_buffering", ["on", "off"])
async def test_aborted_uploads_leave_no_unretrieved_future_in_the_error_log(gateway_factory, request_buffering):
    with CountingUpstream(echo_length) as up:
        gw = gateway_factory(lambda p: config(p, [up.address], f"proxy_request_buffering: {request_buffering}"))
        for _ in range(5):
            _, writer = await open_request(
                gw.port, b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"a" * 5000
            )
            if request_buffering == "off":  # the exchange with the upstream has begun
                deadline = time.monotonic() + 5
                while up.accepted == 0 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            else:
                await asyncio.sleep(0.05)
            writer.transport.abort()
        async with aiohttp.ClientSession() as session, session.post(gw.url + "/up", data=b"ok") as resp:
            assert resp.status == 200  # and the gateway still works
        assert gw.stop() == 0  # at exit every leftover future is collected and would be reported
    assert gw.stdout().count('"POST /up HTTP/1.1" 499 ') == 5  # each abort was seen as one
    stderr = gw.stderr()
    assert "never retrieved" not in stderr and "Traceback" not in stderr, stderr


# -- response buffering ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "header", "released"),
    [
        ("proxy_buffering: on", b"", True),
        ("proxy_buffering: off", b"", False),
        ("proxy_buffering: on", b"X-Accel-Buffering: no\r\n", False),
        ("proxy_buffering: off", b"X-Accel-Buffering: yes\r\n", True),
        ("proxy_max_temp_file_size: 1m", b"", False),  # past the file bound: backpressure, as nginx
    ],
)
async def test_a_slow_reader_holds_the_upstream_only_without_buffering(
    gateway_factory, tmp_path, setting, header, released
):
    size = 10 * MiB
    temp_dir = tmp_path / "responses"
    temp_dir.mkdir()
    with CountingUpstream(big_response(size, header)) as up:
        gw = gateway_factory(lambda p: config(p, [up.address], setting, top=f"temp_path: {temp_dir}\n", keepalive=0))
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)  # a small window: a slow reader
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", gw.port))
        await loop.sock_sendall(sock, b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = bytearray()
        slow_until = time.monotonic() + 2.5
        while time.monotonic() < slow_until:  # ~10 KB/s
            received += await loop.sock_recv(sock, 1024)
            await asyncio.sleep(0.1)
        if released:
            assert up.finished_at and up.eof_at, "the upstream connection is still held by a slow client"
            assert up.eof_at[0] - up.finished_at[0] < 1.0
            assert temp_fds(gw, temp_dir), "the response was not spilled to a temp file"
        else:
            assert not up.eof_at, "the upstream connection was let go although buffering is off"
        while chunk := await asyncio.wait_for(loop.sock_recv(sock, MiB), 10):
            received += chunk
        sock.close()
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"x-accel-buffering" not in head.lower()
    assert len(body) == size and body == pattern(size)
    assert temp_fds(gw, temp_dir) == []


async def test_a_client_gone_mid_download_leaves_no_temp_file(gateway_factory, tmp_path):
    temp_dir = tmp_path / "responses"
    temp_dir.mkdir()
    with CountingUpstream(big_response(10 * MiB)) as up:
        gw = gateway_factory(lambda p: config(p, [up.address], top=f"temp_path: {temp_dir}\n", keepalive=0))
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", gw.port))
        await loop.sock_sendall(sock, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(loop.sock_recv(sock, 1024), 5)
        deadline = time.monotonic() + 5
        while not temp_fds(gw, temp_dir) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert temp_fds(gw, temp_dir)
        sock.close()
        assert await temp_files_gone(gw, temp_dir)
        async with aiohttp.ClientSession() as session, session.get(gw.url + "/again") as resp:
            assert resp.status == 200 and len(await resp.read()) == 10 * MiB  # and the gateway goes on
    assert await temp_files_gone(gw, temp_dir)
    assert "Traceback" not in gw.stderr()


async def test_sse_still_flows_event_by_event_with_buffering_on(gateway_factory):
    async def events(up: CountingUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(3):
            event = b"data: %d\n\n" % i
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.3)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    with CountingUpstream(events) as up:
        gw = gateway_factory(lambda p: config(p, [up.address]))
        async with aiohttp.ClientSession() as session, session.get(gw.url + "/events") as resp:
            arrivals = []
            started = time.monotonic()
            async for line in resp.content:
                if line.startswith(b"data:"):
                    arrivals.append(time.monotonic() - started)
    assert len(arrivals) == 3
    assert arrivals[0] < 0.25  # the first event is not held back until more data comes


@pytest.mark.slow
async def test_one_gib_download_to_a_slowish_client_spills_to_disk_with_bounded_rss(gateway_factory, tmp_path):
    temp_dir = tmp_path / "responses"
    temp_dir.mkdir()
    with CountingUpstream(big_response(GiB)) as up:
        gw = gateway_factory(lambda p: config(p, [up.address], top=f"temp_path: {temp_dir}\n", keepalive=0))
        expected = 1
        block = pattern(MiB)
        for _ in range(1024):
            expected = zlib.adler32(block, expected)
        checksum, received, spilled = 1, 0, False
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(gw.url + "/big") as resp:
            async for chunk in resp.content.iter_chunked(MiB):
                received += len(chunk)
                checksum = zlib.adler32(chunk, checksum)
                if received % (64 * MiB) < len(chunk):
                    spilled = spilled or bool(temp_fds(gw, temp_dir))
                    await asyncio.sleep(0.2)  # slower than the upstream: the rest waits on disk
        assert up.eof_at  # the upstream was let go
    assert (received, checksum) == (GiB, expected)
    assert spilled
    assert gw.rss_peak_kb() < 200 * 1024, f"gateway peak RSS {gw.rss_peak_kb()} kB"
    assert await temp_files_gone(gw, temp_dir)


# -- configuration -----------------------------------------------------------------------------


def test_buffering_settings_are_inherited_and_parsed(tmp_path):
    text = f"""
temp_path: {tmp_path}
upstreams:
  app: {{servers: [127.0.0.1:9000]}}
defaults:
  proxy_buffering: off
  proxy_buffers: 8 8k
routes:
  - location: /
    upstream: app
  - location: /up/
    upstream: app
    proxy_request_buffering: off
    proxy_buffering: on
    client_body_buffer_size: 1m
    client_body_deadline: 0
    proxy_max_temp_file_size: 0
"""
    plan = load_config_text(text, "t.yaml")
    first, second = (route.buffers for route in plan.routes)
    assert (first.request_buffering, first.response_buffering, first.proxy_buffers) == (True, False, 64 * 1024)
    assert (first.client_body_buffer_size, first.client_body_deadline_s) == (16 * 1024, 300.0)
    assert first.max_temp_file_size == GiB and first.temp_path == str(tmp_path)
    assert (second.request_buffering, second.response_buffering) == (False, True)
    assert (second.client_body_buffer_size, second.client_body_deadline_s, second.max_temp_file_size) == (MiB, 0, 0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("temp_path: /nonexistent/dir", "temp_path: temp_path '/nonexistent/dir' is not an existing directory"),
        ("defaults: {proxy_buffers: 0}", "proxy_buffers must be more than 0 bytes"),
        ("defaults: {proxy_buffers: 8 lots}", "invalid size 'lots'"),
        ("defaults: {proxy_buffering: maybe}", "expected on or off, got 'maybe'"),
        ("defaults: {client_body_deadline: soon}", "invalid duration 'soon'"),
    ],
)
def test_bad_buffering_settings_are_reported(line, message):
    text = f"{line}\nupstreams:\n  app: {{servers: [127.0.0.1:9000]}}\nroutes:\n  - {{location: /, upstream: app}}\n"
    with pytest.raises(ConfigErrors) as info:
        load_config_text(text, "t.yaml")
    assert any(message in str(e) for e in info.value.errors), info.value.errors


async def test_gateway_refuses_to_start_with_an_unusable_temp_path(gateway_factory, tmp_path):
    gw = gateway_factory(lambda p: config(p, ["127.0.0.1:9"], top=f"temp_path: {tmp_path / 'missing'}\n"), start=False)
    with pytest.raises(RuntimeError, match="is not an existing directory"):
        gw.start()


# -- the spool on its own ----------------------------------------------------------------------


class RecordingProducer:
    def __init__(self) -> None:
        self.paused = False
        self.pauses = 0

    def pause_body(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_body(self) -> None:
        self.paused = False

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


async def test_response_spool_keeps_byte_order_across_memory_file_and_backpressure(tmp_path):
    from gateway.proxy.spool import BufferPolicy, ResponseSpool

    policy = BufferPolicy(proxy_buffers=1000, max_temp_file_size=5000, temp_path=str(tmp_path))
    spool = ResponseSpool(policy, lambda: TimeoutError("read"), lambda exc, owner: None)
    producer = RecordingProducer()
    spool.attach(producer)
    source = pattern(60_000)
    sizes = [1, 700, 333, 2000, 64, 1500, 999, 4000, 10, 3000]
    fed, out = 0, bytearray()
    chunks = spool.chunks(1.0)
    while fed < len(source):
        while not producer.paused and fed < len(source):  # the upstream sends while it may
            size = sizes[fed % len(sizes)]
            spool.feed(source[fed : fed + size])
            fed += min(size, len(source) - fed)
            assert spool._in_memory <= 1000 + 4000  # the bound, plus at most one read
        for _ in range(3):  # the client takes a little
            if spool.buffered:
                out += await chunks.__anext__()
    spool.end()
    out += b"".join([chunk async for chunk in chunks])
    assert bytes(out) == source
    assert spool.spilled > 0 and producer.pauses > 0  # both the file and backpressure were used
    spool.close()
