"""Upstream behaviours at the byte level: a scripted raw-socket upstream behind the CLI gateway."""

from __future__ import annotations

import asyncio
import io

import aiohttp
import pytest

from tests.support.config import config
from tests.support.http import get
from tests.support.upstreams import ScriptUpstream, read_request

PLAIN = {"admin": "{listen: off}", "upstream_options": "read_timeout: 2s"}  # the scripted upstream behind a bare proxy


async def test_interim_1xx_responses_are_skipped(gateway_factory):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Final: yes\r\n\r\nhello"
        )
        await writer.drain()
        await reader.read()

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        status, headers, body, _ = await get(gw.url + "/")
    assert (status, body, headers.get("X-Final")) == (200, b"hello", "yes")
    assert "Link" not in headers


async def test_an_idle_connection_closed_by_the_upstream_is_replaced_silently(gateway_factory):
    async def script(reader, writer):
        # one request per connection, then the upstream closes it while it sits in our pool
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.1)

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        for _ in range(3):
            assert (await get(gw.url + "/"))[0] == 200
            await asyncio.sleep(0.3)
        assert up.connections == 3
    assert "while talking to upstream" not in gw.stderr()  # not counted as a failure


async def test_a_close_delimited_body_ends_at_eof(gateway_factory):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"x" * 300_000)
        await writer.drain()

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        status, _, body, _ = await get(gw.url + "/")
    assert status == 200 and body == b"x" * 300_000


async def test_chunked_response_with_trailers(gateway_factory):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 42\r\n\r\n"
        )
        await writer.drain()
        await reader.read()

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        status, headers, body, _ = await get(gw.url + "/")
    assert (status, body) == (200, b"hello world")
    assert "Trailer" not in headers


@pytest.mark.parametrize(
    "reply",
    [b"NOT HTTP AT ALL\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"],
)
async def test_an_invalid_response_is_a_502(gateway_factory, reply):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        await asyncio.sleep(0.5)

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        status, _, _, _ = await get(gw.url + "/")
    assert status == 502
    assert "invalid response" in gw.stderr()


async def test_a_truncated_body_cuts_the_client_connection(gateway_factory):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"y" * 400_000)
        await writer.drain()

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        with pytest.raises(aiohttp.ClientPayloadError):
            await get(gw.url + "/")
    assert "closed the connection in the middle of the body" in gw.stderr()


async def test_a_response_before_the_whole_request_body_is_relayed(gateway_factory):
    async def script(reader, writer):
        await read_request(reader)
        await reader.readexactly(10)  # reads only the start of the body, then refuses it
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope")
        await writer.drain()

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        async with aiohttp.ClientSession() as session:
            async with session.post(gw.url + "/", data=b"z" * 20) as resp:
                assert (resp.status, await resp.read()) == (403, b"nope")


async def test_a_too_big_response_header_is_a_502(gateway_factory):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(80)) + b"\r\n"
        )
        await writer.drain()
        await asyncio.sleep(0.5)

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        status, _, _, _ = await get(gw.url + "/")
    assert status == 502
    assert "upstream sent too big header" in gw.stderr()


async def test_connection_cannot_strip_the_framing_request_smuggling(gateway_factory, upstream):
    gw = gateway_factory(config(upstream, **PLAIN))
    smuggled = b"GET /SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(
        b"POST /echo/first HTTP/1.1\r\nHost: x\r\nConnection: content-length\r\n"
        b"Content-Length: %d\r\n\r\n" % len(smuggled) + smuggled
    )
    await writer.drain()
    first = await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    assert first.startswith(b"HTTP/1.1 200")
    status, _, body, _ = await get(gw.url + "/echo/victim")  # another client, maybe the same upstream connection
    assert status == 200 and b"/echo/victim" in body and b"SMUGGLED" not in body
    paths = [e["path"] for e in upstream.seen]
    assert paths == ["/echo/first", "/echo/victim"]
    assert upstream.seen[0]["body_bytes"] == len(smuggled)


async def test_bytes_on_an_idle_upstream_connection_never_reach_a_client(gateway_factory):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
        await writer.drain()
        await asyncio.sleep(0.2)  # then, while the connection idles in the gateway's pool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nSTOLEN")
        await writer.drain()
        try:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nlater")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        await asyncio.sleep(0.2)

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        assert (await get(gw.url + "/"))[2] == b"first"
        await asyncio.sleep(0.4)
        status, _, body, _ = await get(gw.url + "/")
    assert (status, body) in ((200, b"first"), (200, b"later")) and body != b"STOLEN"


async def test_header_bytes_pass_unchanged_both_ways(gateway_factory):
    seen: list[bytes] = []

    async def script(reader, writer):
        seen.append(await read_request(reader))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
            b'Content-Disposition: attachment; filename="caf\xc3\xa9.txt"\r\n\r\nok'
        )
        await writer.drain()
        await reader.read()

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"GET / HTTP/1.1\r\nHost: x\r\nX-Name: Jos\xc3\xa9 \xe6\x97\xa5\r\nX-Raw: \xff\xfe\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(65536), 5)
        writer.close()
    assert b"X-Name: Jos\xc3\xa9 \xe6\x97\xa5\r\n" in seen[0]
    assert b"X-Raw: \xff\xfe\r\n" in seen[0]
    assert b'filename="caf\xc3\xa9.txt"' in reply


async def test_an_early_answer_during_a_large_upload_reaches_the_client(gateway_factory):
    async def script(reader, writer):
        await read_request(reader)
        await reader.readexactly(1024)
        writer.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big!")
        await writer.drain()
        # a lingering close, as real servers do: closing with unread data would send a
        # reset that destroys the answer in flight, for any client
        while await reader.read(65536):
            pass

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN, routes="  - {location: /, upstream: app, client_max_body_size: 0}"))
        async with aiohttp.ClientSession() as session:
            async with session.post(gw.url + "/", data=io.BytesIO(b"u" * (20 * 1024 * 1024))) as resp:
                assert (resp.status, await resp.read()) == (413, b"too big!")


async def test_no_content_type_is_invented(gateway_factory):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read()

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        status, headers, _, _ = await get(gw.url + "/")
    assert status == 200 and "Content-Type" not in headers


async def test_after_a_stale_pooled_connection_the_retry_uses_a_fresh_one(gateway_factory):
    async def script(reader, writer):
        await read_request(reader)
        await asyncio.sleep(0.3)  # hold the connection, so that the gateway opens several
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.2)  # then close it while it is idle in the pool

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        async with aiohttp.ClientSession() as session:

            async def one() -> int:
                async with session.get(gw.url + "/") as resp:
                    await resp.read()
                    return resp.status

            assert await asyncio.gather(*(one() for _ in range(4))) == [200] * 4
        await asyncio.sleep(0.4)  # four dead connections now sit in the pool
        assert (await get(gw.url + "/"))[0] == 200
    assert "while talking to upstream" not in gw.stderr()
