"""WebSocket through the CLI-started gateway, the nginx way: handshake relayed, then a raw byte tunnel.

Two kinds of upstream run in the test's own loop: an aiohttp WebSocket server
(real frames, pings, close codes) and raw sockets (byte-exact answers, and
peers that stop reading). Clients are aiohttp's WebSocket client or a raw
socket speaking the handshake by hand.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web

from tests.support.config import config
from tests.support.gateway import Gateway
from tests.support.ports import free_port
from tests.support.upstreams import ScriptUpstream, read_request

KEY = base64.b64encode(b"0123456789abcdef").decode()
MiB = 1 << 20


def accept_for(key: str) -> str:
    digest = hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
    return base64.b64encode(digest).decode()


def ws_config(upstream: str, read_timeout: str = "3s") -> Callable[[int], str]:
    return config(
        upstream,
        admin="{listen: off}",
        top="log: {format: json}",
        upstream_options=f"connect_timeout: 1s, read_timeout: {read_timeout}",
    )


def handshake_bytes(path: str, extra_headers: str = "") -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: ws.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: chat\r\n"
        f"{extra_headers}\r\n"
    ).encode()


def masked_text_frame(text: str) -> bytes:
    payload = text.encode()
    mask = b"\x11\x22\x33\x44"
    assert len(payload) < 126
    return bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def parse_head(head: bytes) -> tuple[int, dict[str, list[str]]]:
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.setdefault(name.strip().lower(), []).append(value.strip())
    return int(lines[0].split()[1]), headers


async def open_raw(
    port: int, path: str, after_handshake: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int, dict[str, list[str]]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(handshake_bytes(path) + after_handshake)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status, headers = parse_head(head)
    return reader, writer, status, headers


def switching_upstream(first: bytes = b"", headers: bytes = b"", then_close: bool = False) -> Any:
    """A raw upstream: a 101 (plus ``first`` in the same write), then every byte echoed back."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        key = next(
            line.split(b":", 1)[1].strip()
            for line in request.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept_for(key.decode()).encode() + b"\r\n" + headers + b"\r\n" + first
        )
        await writer.drain()
        if then_close:
            return
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()

    return script


async def wait_for_log(gw: Gateway, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    async with asyncio.timeout(5):
        while True:
            for line in gw.stdout().splitlines():
                if line.strip():
                    entry = json.loads(line)
                    if match(entry):
                        return entry
            await asyncio.sleep(0.05)  # the access log is flushed every 100 ms


class EchoUpstream:
    """An aiohttp WebSocket server: echoes text and binary, sets a cookie on its 101."""

    def __init__(self) -> None:
        self.port = free_port()
        self.seen: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None

    async def start(self) -> EchoUpstream:
        app = web.Application()
        app.router.add_get("/echo", self._echo)
        app.router.add_get("/moved", self._moved)
        app.router.add_get("/private", self._private)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def _echo(self, request: web.Request) -> web.WebSocketResponse:
        self.seen.append({k.lower(): v for k, v in request.headers.items()})
        ws = web.WebSocketResponse(protocols=("chat",), max_msg_size=0, autoping=True, compress=False)
        ws.set_cookie("sid", "s3cret")
        await ws.prepare(request)
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                if msg.data == "close-me":
                    await ws.close(code=4001, message=b"asked")
                    break
                await ws.send_str("echo:" + msg.data)
            elif msg.type is WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
        return ws

    async def _moved(self, request: web.Request) -> web.Response:
        self.seen.append({k.lower(): v for k, v in request.headers.items()})
        target = request.query["to"]
        return web.Response(status=302, headers={"Location": target}, text="moved there")

    async def _private(self, request: web.Request) -> web.Response:
        self.seen.append({k.lower(): v for k, v in request.headers.items()})
        return web.Response(
            status=401, headers={"WWW-Authenticate": 'Basic realm="ws"', "X-Reason": "no token"}, text="who are you?"
        )

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def echo() -> AsyncIterator[EchoUpstream]:
    upstream = await EchoUpstream().start()
    yield upstream
    await upstream.stop()


# -- the handshake ------------------------------------------------------------------------------


async def test_the_101_carries_the_upstream_headers_and_the_client_handshake_arrives_as_sent(gateway_factory, echo):
    gw = gateway_factory(ws_config(f"127.0.0.1:{echo.port}"))
    reader, writer, status, headers = await open_raw(gw.port, "/echo")
    try:
        assert status == 101
        assert headers["set-cookie"][0].startswith("sid=s3cret")
        assert headers["sec-websocket-accept"] == [accept_for(KEY)]
        assert headers["sec-websocket-protocol"] == ["chat"]
        assert headers["upgrade"] == ["websocket"]
        assert headers["connection"] == ["upgrade"]
        assert "content-length" not in headers and "transfer-encoding" not in headers
        writer.write(masked_text_frame("hi"))
        assert await asyncio.wait_for(reader.readexactly(9), 5) == b"\x81\x07echo:hi"
    finally:
        writer.close()
    seen = echo.seen[-1]
    assert seen["sec-websocket-key"] == KEY  # passed through, not replaced
    assert seen["sec-websocket-protocol"] == "chat"
    assert (seen["connection"], seen["upgrade"]) == ("upgrade", "websocket")
    assert seen["host"] == "ws.example"
    assert seen["x-forwarded-for"] == "127.0.0.1"


async def test_a_redirect_is_relayed_to_the_client_and_never_followed(gateway_factory, echo):
    trap_connections = 0

    async def trap(reader, writer):
        nonlocal trap_connections
        trap_connections += 1
        writer.close()

    trap_port = free_port()
    trap_server = await asyncio.start_server(trap, "127.0.0.1", trap_port)
    gw = gateway_factory(ws_config(f"127.0.0.1:{echo.port}"))
    location = f"http://127.0.0.1:{trap_port}/elsewhere"
    reader, writer, status, headers = await open_raw(gw.port, f"/moved?to={location}")
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"][0])), 5)
    writer.close()
    trap_server.close()
    assert status == 302
    assert headers["location"] == [location]
    assert body == b"moved there"
    assert trap_connections == 0
    entry = await wait_for_log(gw, lambda e: e["request_uri"].startswith("/moved"))
    assert (entry["status"], entry["upstream_status"]) == (302, "302")


async def test_a_refusal_reaches_the_client_whole(gateway_factory, echo):
    gw = gateway_factory(ws_config(f"127.0.0.1:{echo.port}"))
    reader, writer, status, headers = await open_raw(gw.port, "/private")
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"][0])), 5)
    writer.close()
    assert status == 401
    assert headers["www-authenticate"] == ['Basic realm="ws"']
    assert headers["x-reason"] == ["no token"]
    assert body == b"who are you?"
    entry = await wait_for_log(gw, lambda e: e["request_uri"] == "/private")
    assert (entry["status"], entry["body_bytes_sent"]) == (401, len(b"who are you?"))


@pytest.mark.parametrize("same_write", [True, False])
async def test_a_refused_upgrade_opens_no_tunnel_to_smuggle_requests_through(gateway_factory, same_write):
    """WebSocket smuggling: after a non-101 answer, what the client sends next is HTTP for the
    gateway (routing, limits, its own 404), never bytes passed to the upstream's connection."""
    upstream_received = bytearray()

    async def refuse(reader, writer):
        upstream_received.extend(await read_request(reader))
        writer.write(b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 4\r\n\r\nnope")
        await writer.drain()
        while data := await reader.read(65536):
            upstream_received.extend(data)

    smuggled = b"GET /internal HTTP/1.1\r\nHost: ws.example\r\n\r\n"
    async with ScriptUpstream(refuse) as up:
        gw = gateway_factory(lambda p: ws_config(f"127.0.0.1:{up.port}")(p).replace("location: /,", "location: /ws,"))
        reader, writer, status, headers = await open_raw(gw.port, "/ws", smuggled if same_write else b"")
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"][0])), 5)
        if not same_write:
            writer.write(smuggled)
        status2, _ = parse_head(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5))
        writer.close()
    assert (status, body) == (426, b"nope")
    assert status2 == 404  # the gateway's: no route for /internal
    assert b"/internal" not in upstream_received


async def test_bytes_on_either_side_of_the_101_are_not_lost(gateway_factory):
    """The upstream's first bytes share a write with its 101; the client's with its handshake."""
    async with ScriptUpstream(switching_upstream(first=b"FIRST")) as up:
        gw = gateway_factory(ws_config(f"127.0.0.1:{up.port}"))
        reader, writer, status, _ = await open_raw(gw.port, "/", after_handshake=b"EARLY")
        got = await asyncio.wait_for(reader.readexactly(len(b"FIRSTEARLY")), 5)
        writer.close()
    assert status == 101
    assert got == b"FIRSTEARLY"


async def test_a_101_without_upgrade_header_is_a_502(gateway_factory):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\n\r\nRAW")
        await writer.drain()
        await reader.read()

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(ws_config(f"127.0.0.1:{up.port}"))
        reader, writer, status, headers = await open_raw(gw.port, "/")
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"][0])), 5)
        writer.close()
    assert status == 502
    assert b"RAW" not in body


async def test_an_upgrade_request_with_a_body_is_refused(gateway_factory, echo):
    gw = gateway_factory(ws_config(f"127.0.0.1:{echo.port}"))
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(handshake_bytes("/echo", "Content-Length: 5\r\n") + b"HELLO")
    status, _ = parse_head(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5))
    writer.close()
    assert status == 400
    assert echo.seen == []


async def test_connect_failure_moves_on_to_the_next_server(gateway_factory, echo):
    dead = f"127.0.0.1:{free_port()}"
    gw = gateway_factory(ws_config(f"{dead}, 127.0.0.1:{echo.port}"))
    async with aiohttp.ClientSession() as session, session.ws_connect(gw.url + "/echo") as ws:
        await ws.send_str("hi")
        assert (await ws.receive(timeout=5)).data == "echo:hi"
    assert "connect() failed" in gw.stderr()


# -- the tunnel ---------------------------------------------------------------------------------


async def test_text_binary_ping_close_and_a_20_mib_message_pass(gateway_factory, echo):
    gw = gateway_factory(ws_config(f"127.0.0.1:{echo.port}"))
    big = os.urandom(20 * MiB)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(gw.url + "/echo", autoping=False, max_msg_size=0, compress=0) as ws:
            await ws.send_str("héllo")
            assert (await ws.receive(timeout=5)).data == "echo:héllo"
            await ws.send_bytes(b"\x00\x01\xff")
            assert (await ws.receive(timeout=5)).data == b"\x00\x01\xff"
            await ws.ping(b"are you there")
            pong = await ws.receive(timeout=5)
            assert (pong.type, pong.data) == (WSMsgType.PONG, b"are you there")  # the upstream's answer
            await ws.send_bytes(big)
            echoed = await ws.receive(timeout=30)
            assert echoed.type is WSMsgType.BINARY and echoed.data == big
            await ws.send_str("close-me")
            closing = await ws.receive(timeout=5)
            assert (closing.type, closing.data, closing.extra) == (WSMsgType.CLOSE, 4001, "asked")


@pytest.mark.parametrize("closer", ["client", "upstream"])
async def test_a_closed_tunnel_is_logged_as_101_with_the_bytes_sent(gateway_factory, closer):
    script = switching_upstream(first=b"bye", then_close=True) if closer == "upstream" else switching_upstream()
    async with ScriptUpstream(script) as up:
        gw = gateway_factory(ws_config(f"127.0.0.1:{up.port}"))
        reader, writer, status, _ = await open_raw(gw.port, "/t")
        assert status == 101
        if closer == "client":
            writer.write(b"x" * 1000)
            assert await asyncio.wait_for(reader.readexactly(1000), 5) == b"x" * 1000
            writer.close()
            sent = 1000
        else:
            assert await asyncio.wait_for(reader.read(), 5) == b"bye"  # then the end of the stream
            writer.close()
            sent = 3
        entry = await wait_for_log(gw, lambda e: e["request_uri"] == "/t")
    assert entry["status"] == 101
    assert entry["upstream_status"] == "101"
    assert entry["body_bytes_sent"] == sent


async def test_a_client_that_stops_reading_stalls_the_upstream_not_the_gateway(gateway_factory):
    """Backpressure: the upstream's writes block; the gateway's memory does not grow with them."""
    pushed = 0
    stalled = asyncio.Event()

    async def flood(reader, writer):
        nonlocal pushed
        await read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        block = b"z" * MiB
        try:
            while pushed < 512 * MiB:
                writer.write(block)
                async with asyncio.timeout(1.5):
                    await writer.drain()
                pushed += len(block)
        except TimeoutError:
            stalled.set()
        await reader.read()

    async with ScriptUpstream(flood) as up:
        gw = gateway_factory(ws_config(f"127.0.0.1:{up.port}", read_timeout="20s"))
        reader, writer, status, _ = await open_raw(gw.port, "/flood")
        assert status == 101
        before_kb = gw.rss_peak_kb()
        await asyncio.wait_for(stalled.wait(), 60)
        grown_kb = gw.rss_peak_kb() - before_kb
        print(f"client reads nothing: upstream stalled after {pushed / MiB:.0f} MiB, gateway peak RSS +{grown_kb} kB")
        assert pushed < 96 * MiB, f"{pushed / MiB:.0f} MiB pushed into a client that reads nothing"
        assert grown_kb < 32 * 1024, f"gateway grew by {grown_kb} kB"
        # nothing was lost: once the client reads, everything pushed arrives
        received = 0
        async with asyncio.timeout(30):
            while received < pushed:
                received += len(await reader.read(MiB))
        writer.close()
    assert received >= pushed


async def test_an_upstream_that_stops_reading_stalls_the_client_not_the_gateway(gateway_factory):
    async def deaf(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(30)  # reads nothing more; cancelled when the test's server closes

    async with ScriptUpstream(deaf) as up:
        gw = gateway_factory(ws_config(f"127.0.0.1:{up.port}", read_timeout="20s"))
        _reader, writer, status, _ = await open_raw(gw.port, "/deaf")
        assert status == 101
        before_kb = gw.rss_peak_kb()
        pushed = 0
        block = b"c" * MiB
        with pytest.raises(TimeoutError):
            while pushed < 512 * MiB:
                writer.write(block)
                async with asyncio.timeout(1.5):
                    await writer.drain()
                pushed += len(block)
        grown_kb = gw.rss_peak_kb() - before_kb
        print(f"upstream reads nothing: client stalled after {pushed / MiB:.0f} MiB, gateway peak RSS +{grown_kb} kB")
        writer.transport.abort()
    assert pushed < 96 * MiB, f"{pushed / MiB:.0f} MiB pushed into an upstream that reads nothing"
    assert grown_kb < 32 * 1024, f"gateway grew by {grown_kb} kB"


async def test_an_idle_tunnel_is_closed_after_read_timeout(gateway_factory):
    upstream_saw_eof = asyncio.Event()

    async def echo_until_eof(reader, writer):
        await switching_upstream()(reader, writer)
        upstream_saw_eof.set()

    async with ScriptUpstream(echo_until_eof) as up:
        gw = gateway_factory(ws_config(f"127.0.0.1:{up.port}", read_timeout="1s"))
        reader, writer, status, _ = await open_raw(gw.port, "/idle")
        assert status == 101
        loop = asyncio.get_running_loop()
        # traffic every 0.4 s keeps it open past the 1 s limit ...
        for i in range(5):
            if i:
                await asyncio.sleep(0.4)
            writer.write(b"k")
            assert await asyncio.wait_for(reader.readexactly(1), 5) == b"k"
        # ... silence closes it, on both sides
        quiet_since = loop.time()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        closed_after = loop.time() - quiet_since
        await asyncio.wait_for(upstream_saw_eof.wait(), 5)
        writer.close()
        entry = await wait_for_log(gw, lambda e: e["request_uri"] == "/idle")
    assert 0.8 <= closed_after < 3
    assert (entry["status"], entry["body_bytes_sent"]) == (101, 5)
    assert "upstream timed out (no data for 1s) while proxying upgraded connection" in gw.stderr()


async def test_a_tunnel_to_a_tls_upstream(gateway_factory, tmp_path):
    """wss upstream: the TLS transport is handed over to the tunnel like a plain one."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = await asyncio.create_subprocess_exec(
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-days", "1",
        "-keyout", str(key), "-out", str(cert),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert await made.wait() == 0
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    upstream = EchoUpstream()
    app = web.Application()
    app.router.add_get("/echo", upstream._echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", upstream.port, ssl_context=context).start()
    try:
        gw = gateway_factory(
            lambda p: ws_config(f"127.0.0.1:{upstream.port}")(p).replace(
                "connect_timeout: 1s", "scheme: https, tls_verify: false, connect_timeout: 1s"
            )
        )
        payload = os.urandom(3 * MiB)
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(gw.url + "/echo", max_msg_size=0, autoping=False) as ws:
                await ws.send_bytes(payload)
                assert (await ws.receive(timeout=10)).data == payload
                await ws.ping(b"tls")
                assert (await ws.receive(timeout=5)).data == b"tls"
    finally:
        await runner.cleanup()


@pytest.mark.timing
async def test_shutdown_ends_an_open_tunnel_within_shutdown_timeout(gateway_factory):
    async with ScriptUpstream(switching_upstream()) as up:
        gw = gateway_factory(lambda p: ws_config(f"127.0.0.1:{up.port}")(p) + "shutdown_timeout: 1s\n")
        reader, writer, status, _ = await open_raw(gw.port, "/open")
        assert status == 101
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        loop = asyncio.get_running_loop()
        started = loop.time()
        code = await asyncio.to_thread(gw.stop, 10)
        took = loop.time() - started
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    assert code == 0
    assert took < 5
    entry = next(json.loads(line) for line in gw.stdout().splitlines() if '"/open"' in line)
    assert (entry["status"], entry["body_bytes_sent"]) == (101, 4)
