"""One response per request: what an upstream sends after a complete response is never relayed.

A raw-socket upstream writes a complete response and, in the same write, more
bytes: a second response (response splitting / cache poisoning by a hostile or
broken upstream) or garbage. The client must get the first response intact, the
extra bytes must be logged and dropped, and the connection must not be reused.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.support.config import config
from tests.support.http import get
from tests.support.upstreams import ScriptUpstream, read_request

POISON = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nX-Poison: 1\r\n\r\nPOISON"
BIG = b"b" * 300_000  # larger than the gateway's buffered-body limit: the streamed path

CASES = {
    "second response": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + POISON, b"ok"),
    "garbage": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\x00\xffNOT HTTP\r\n\r\n", b"ok"),
    "blank lines then a response": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\r\n\r\n" + POISON, b"ok"),
    "after interim responses": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + POISON,
        b"ok",
    ),
    "after the last chunk": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n" + POISON,
        b"ok",
    ),
    "after a streamed body": (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG) + BIG + POISON, BIG),
    "after a 204": (b"HTTP/1.1 204 No Content\r\n\r\n" + POISON, b""),
}

PLAIN = {"admin": "{listen: off}", "upstream_options": "read_timeout: 2s"}  # the scripted upstream behind a bare proxy


@pytest.mark.parametrize("case", list(CASES))
async def test_bytes_after_a_complete_response_are_dropped_and_the_connection_closed(gateway_factory, case):
    reply, expected = CASES[case]
    closed_by_gateway = 0

    async def script(reader, writer):
        nonlocal closed_by_gateway
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        await reader.read()  # returns when the gateway closes this connection
        closed_by_gateway += 1

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        for attempt in (1, 2):
            status, headers, body, _ = await get(gw.url + "/")
            assert status == (204 if expected == b"" else 200)
            assert body == expected, f"attempt {attempt}: {body[:40]!r}"
            assert "X-Poison" not in headers
            assert headers.get("Content-Length", str(len(expected))) == str(len(expected))
            # each request had a connection of its own: the first one was not reused
            assert up.connections == attempt
        async with asyncio.timeout(5):
            while closed_by_gateway < 1:
                await asyncio.sleep(0.02)
    errors = gw.stderr()
    assert "upstream sent more data than the response while reading upstream" in errors
    assert "[warn]" in errors


async def test_a_hundred_poisoned_responses_never_leak_into_another_request(gateway_factory):
    """Concurrent clients on a pool of keep-alive connections: no body is ever another's."""

    async def script(reader, writer):
        while True:
            request = await read_request(reader)
            tag = request.split(b" ", 2)[1][1:]
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(tag), tag) + POISON)
            await writer.drain()

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        async with aiohttp.ClientSession() as session:

            async def one(i: int) -> bytes:
                async with session.get(f"{gw.url}/r{i}") as resp:
                    return await resp.read()

            bodies = await asyncio.gather(*(one(i) for i in range(100)))
    assert bodies == [f"r{i}".encode() for i in range(100)]


async def test_a_101_to_a_plain_request_is_a_502(gateway_factory):
    """An upstream cannot turn a plain request into a tunnel."""

    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\nRAW")
        await writer.drain()
        await reader.read()

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        status, _, body, _ = await get(gw.url + "/")
    assert status == 502
    assert b"RAW" not in body
    assert "upstream sent 101 to a request that did not ask to switch protocols" in gw.stderr()


async def test_bytes_on_an_idle_pooled_connection_close_it(gateway_factory):
    """The extra response comes late, while the connection sits in the keep-alive pool."""
    poison_now = asyncio.Event()
    closed_by_gateway = asyncio.Event()

    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await poison_now.wait()
        writer.write(POISON)
        await writer.drain()
        await reader.read()
        closed_by_gateway.set()

    async with ScriptUpstream(script) as up:
        gw = gateway_factory(config(up, **PLAIN))
        assert (await get(gw.url + "/"))[2] == b"ok"  # the gateway has pooled the connection by now
        poison_now.set()
        await asyncio.wait_for(closed_by_gateway.wait(), 5)
        status, headers, body, _ = await get(gw.url + "/")  # a new connection (which gets poisoned too)
    assert (status, body) == (200, b"ok") and "X-Poison" not in headers
    assert up.connections == 2
    assert "upstream sent more data than the response" in gw.stderr()
