"""Pipelined requests are all answered, in order, whatever stands before them.

A custom method (nginx proxies any upper-case token; llhttp knows a fixed list) has to
be renamed for the parser wherever a request starts: after a ``Content-Length`` body,
after a chunked body, in the middle of a packet or at the start of the next one. A
request behind an upgrade the gateway does not switch for (``h2c``: the parser takes
only WebSocket; a WebSocket the upstream answers without 101) must be parsed, not
dropped. Each case goes over a real socket, sent whole and cut at every place where a
packet boundary could fall, to the gateway started through its CLI in front of a raw
upstream that records the method, target and body it read.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.config import basic_config
from tests.support.http import exchange
from tests.support.upstreams import HeadEchoUpstream

HOST = b"Host: a\r\n"
WS = b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
LAST = b"GET /last HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"


class DecliningUpstream(HeadEchoUpstream):
    """The head-echo upstream, answering 403 without a switch for any target under /deny."""

    def respond(self, conn: socket.socket, entry: dict[str, Any]) -> bool:
        if entry["target"].startswith("/deny"):
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno")
            return True
        return super().respond(conn, entry)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Iterator[tuple[int, DecliningUpstream]]:
    from tests.support.gateway import Gateway
    from tests.support.ports import free_port

    upstream = DecliningUpstream().start()
    port = free_port()
    gw = Gateway(tmp_path_factory.mktemp("pipelining"), basic_config(port, [upstream.address]), port).start()
    yield port, upstream
    gw.stop()
    upstream.stop()


def statuses(response: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", response)]


def cuts(wire: bytes, marks: list[bytes]) -> list[list[bytes]]:
    """The wire whole, and cut once just before and once just after each of ``marks``."""
    out = [[wire]]
    for mark in marks:
        at = wire.index(mark)
        for cut in (at, at + len(mark)):
            if 0 < cut < len(wire):
                out.append([wire[:cut], wire[cut:]])
    return out


PIPELINES = {
    "length body, PURGE, PROPFIND, custom": (
        b"POST /a HTTP/1.1\r\n" + HOST + b"Content-Length: 5\r\n\r\nhello"
        b"PURGE /b HTTP/1.1\r\n" + HOST + b"\r\n"
        b"PROPFIND /c HTTP/1.1\r\n" + HOST + b"\r\n"
        b"REFRESH_ALL /d HTTP/1.1\r\n" + HOST + b"\r\n" + LAST,
        [("POST", "/a", b"hello"), ("PURGE", "/b", b""), ("PROPFIND", "/c", b""), ("REFRESH_ALL", "/d", b"")],
        [b"hello", b"PURGE", b"REFRESH_ALL"],
    ),
    "chunked body, custom": (
        b"POST /a HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n3\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n"
        b"FLUSH-CACHE /b HTTP/1.1\r\n" + HOST + b"\r\n" + LAST,
        [("POST", "/a", b"helloabc"), ("FLUSH-CACHE", "/b", b"")],
        [b"hello", b"0\r\n", b"X-Trailer", b"FLUSH-CACHE"],
    ),
    "custom with a body, custom": (
        b"BULK_PUT /a HTTP/1.1\r\n" + HOST + b"Content-Length: 3\r\n\r\nxyz"
        b"PURGE /b HTTP/1.1\r\n" + HOST + b"Content-Length: 2\r\n\r\nhi"
        b"NOTIFY_ALL /c HTTP/1.1\r\n" + HOST + b"\r\n" + LAST,
        [("BULK_PUT", "/a", b"xyz"), ("PURGE", "/b", b"hi"), ("NOTIFY_ALL", "/c", b"")],
        [b"xyz", b"NOTIFY_ALL"],
    ),
    "declined WebSocket, custom": (
        b"GET /deny HTTP/1.1\r\n" + HOST + WS + b"\r\n" + b"REINDEX /b HTTP/1.1\r\n" + HOST + b"\r\n" + LAST,
        [("GET", "/deny", b""), ("REINDEX", "/b", b"")],
        [b"REINDEX"],
    ),
    "WebSocket answered 200, GET": (
        b"GET /plain HTTP/1.1\r\n" + HOST + WS + b"\r\n" + b"GET /b HTTP/1.1\r\n" + HOST + b"\r\n" + LAST,
        [("GET", "/plain", b""), ("GET", "/b", b"")],
        [b"GET /b"],
    ),
    "h2c upgrade, GET": (
        b"GET /a HTTP/1.1\r\n" + HOST + b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n" + b"GET /b HTTP/1.1\r\n" + HOST + b"\r\n" + LAST,
        [("GET", "/a", b""), ("GET", "/b", b"")],
        [b"GET /b"],
    ),
}


@pytest.mark.parametrize("name", list(PIPELINES))
def test_every_pipelined_request_is_answered_in_order(target, name):
    port, upstream = target
    wire, expected, marks = PIPELINES[name]
    expected = [*expected, ("GET", "/last", b"")]
    first_status = 403 if expected[0][1] == "/deny" else 200
    for pieces in cuts(wire, marks):
        before = len(upstream.heads)
        response = exchange(port, pieces)
        assert statuses(response) == [first_status] + [200] * (len(expected) - 1), (name, pieces, response[-300:])
        seen = [(h["method"], h["target"], h["body_bytes"].encode("latin-1")) for h in upstream.heads[before:]]
        assert seen == expected, (name, pieces)


def test_a_body_that_looks_like_a_request_stays_a_body(target):
    """The framer renames a method only where a request starts: a custom request line inside a
    body reaches the upstream as body bytes, unchanged, and is not answered as a request."""
    port, upstream = target
    inner = b"PURGE /inner HTTP/1.1\r\nHost: a\r\n\r\n"
    wire = b"POST /a HTTP/1.1\r\n" + HOST + b"Content-Length: %d\r\n\r\n" % len(inner) + inner + LAST
    chunked = b"POST /a HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(inner)
    chunked += inner + b"\r\n0\r\n\r\n" + LAST
    for data in (wire, chunked):
        for pieces in cuts(data, [b"PURGE", b"/inner"]):
            before = len(upstream.heads)
            assert statuses(exchange(port, pieces)) == [200, 200]
            seen = [(h["method"], h["target"], h["body_bytes"].encode("latin-1")) for h in upstream.heads[before:]]
            assert seen == [("POST", "/a", inner), ("GET", "/last", b"")]
