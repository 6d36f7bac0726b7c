"""The header of a proxied response, as it goes on the wire (gateway/proxy/respond.py).

The gateway writes it as bytes, not through aiohttp's StreamResponse: these tests pin the
rules that StreamResponse applied, on a real gateway between a real client socket and a
scripted upstream: framing per HTTP version, HEAD, 204, Connection, Date, Server, no
invented Content-Type, the bytes of non-UTF-8 fields, and no header injection.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from aiohttp.http import HttpVersion10, HttpVersion11

from gateway.proxy import respond
from gateway.proxy.respond import Head
from tests.support.config import basic_config
from tests.support.upstreams import HeadEchoUpstream

ANSWERS = {
    "/len": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Up: 1\r\n\r\nhello",
    "/close": b"HTTP/1.1 200 OK\r\nX-Up: 2\r\nConnection: close\r\n\r\nuntil-close",
    "/nobody": b"HTTP/1.1 204 No Content\r\nX-Up: 3\r\n\r\n",
    "/server": b"HTTP/1.1 200 Fine\r\nServer: upstream/1\r\nDate: Tue, 01 Jan 2030 00:00:00 GMT\r\nContent-Length: 2\r\n\r\nok",
    "/typed": b"HTTP/1.1 200 OK\r\nContent-Type: text/x-up\r\nContent-Length: 2\r\n\r\nok",
    "/latin": b"HTTP/1.1 200 OK\r\nX-Latin: caf\xe9\r\nX-Utf8: caf\xc3\xa9\r\nContent-Length: 2\r\n\r\nok",
    "/named": b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Private\r\nX-Private: 1\r\nX-Public: 2\r\nContent-Length: 2\r\n\r\nok",
    "/accel": b"HTTP/1.1 200 OK\r\nX-Accel-Buffering: no\r\nContent-Length: 2\r\n\r\nok",
}


class ScriptedUpstream(HeadEchoUpstream):
    """Answers each request with ``ANSWERS[target]``; closes after the ones without a length."""

    def respond(self, conn: socket.socket, entry: dict[str, Any]) -> bool:
        method, target = entry["method"], entry["target"]
        answer = ANSWERS.get(target.split("?")[0], ANSWERS["/len"])
        if method == "HEAD":
            answer = answer.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
        conn.sendall(answer)
        return not (target == "/close" and method != "HEAD")


@pytest.fixture
def scripted():
    up = ScriptedUpstream().start()
    yield up
    up.stop()


@pytest.fixture
def gw(gateway_factory, scripted):
    extra = """
    add_header:
      - {name: X-Added, value: "$uri", always: true}
"""
    return gateway_factory(lambda p: basic_config(p, [f"127.0.0.1:{scripted.port}"]) + extra)


def ask(port: int, request: bytes) -> tuple[bytes, bytes, bool]:
    """Send one request; return the head, the rest, and whether the gateway closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        closed = False
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        fields = {k.lower(): v for k, _, v in (line.partition(b": ") for line in lines[1:])}
        if request.startswith(b"HEAD "):
            pass  # a length, and no body
        elif b"content-length" in fields:
            while len(rest) < int(fields[b"content-length"]) and not closed:
                chunk = sock.recv(65536)
                closed = not chunk
                rest += chunk
        elif b"transfer-encoding" in fields:
            while not rest.endswith(b"0\r\n\r\n") and not closed:
                chunk = sock.recv(65536)
                closed = not chunk
                rest += chunk
        # Whatever else comes: a body delimited by the close arrives in any number of
        # reads before the end, so read until the end or until 0.5 s of quiet.
        sock.settimeout(0.5)
        while not closed:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            rest += chunk
            closed = not chunk
    return head, rest, closed


def fields_of(head: bytes) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b": ")
        out.setdefault(name.lower(), []).append(value)
    return out


def test_http11_with_a_length_keeps_the_connection_and_adds_date_and_server(gw):
    head, body, closed = ask(gw.port, b"GET /len HTTP/1.1\r\nHost: x\r\n\r\n")
    f = fields_of(head)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert f[b"content-length"] == [b"5"] and body == b"hello"
    assert b"transfer-encoding" not in f and b"connection" not in f and not closed
    assert f[b"server"] == [b"gateway"] and len(f[b"date"]) == 1 and f[b"date"][0].endswith(b" GMT")
    assert b"content-type" not in f  # none invented for a body the upstream did not type
    assert f[b"x-up"] == [b"1"] and f[b"x-added"] == [b"/len"]


def test_http11_without_a_length_is_chunked(gw):
    head, body, closed = ask(gw.port, b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
    f = fields_of(head)
    assert f[b"transfer-encoding"] == [b"chunked"] and b"content-length" not in f
    assert body == b"b\r\nuntil-close\r\n0\r\n\r\n" and not closed
    assert b"connection" not in f  # the upstream's Connection: close is hop-by-hop


def test_http10_keep_alive_is_answered_and_no_length_ends_with_the_connection(gw):
    head, body, closed = ask(gw.port, b"GET /len HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    f = fields_of(head)
    assert head.startswith(b"HTTP/1.0 200 OK\r\n")
    assert f[b"connection"] == [b"keep-alive"] and body == b"hello" and not closed
    head, body, closed = ask(gw.port, b"GET /close HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    f = fields_of(head)
    assert b"transfer-encoding" not in f and b"content-length" not in f and b"connection" not in f
    assert body == b"until-close" and closed
    head, body, closed = ask(gw.port, b"GET /len HTTP/1.0\r\n\r\n")
    assert b"connection" not in fields_of(head) and body == b"hello" and closed


def test_connection_close_from_the_client(gw):
    head, body, closed = ask(gw.port, b"GET /len HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert fields_of(head)[b"connection"] == [b"close"] and body == b"hello" and closed


def test_head_keeps_the_length_and_sends_no_body(gw):
    head, body, closed = ask(gw.port, b"HEAD /len HTTP/1.1\r\nHost: x\r\n\r\n")
    f = fields_of(head)
    assert f[b"content-length"] == [b"5"] and body == b"" and not closed
    head, body, _ = ask(gw.port, b"HEAD /close HTTP/1.1\r\nHost: x\r\n\r\n")
    f = fields_of(head)
    assert b"content-length" not in f and b"transfer-encoding" not in f and body == b""


def test_204_has_no_framing_headers(gw):
    head, body, closed = ask(gw.port, b"GET /nobody HTTP/1.1\r\nHost: x\r\n\r\n")
    f = fields_of(head)
    assert head.startswith(b"HTTP/1.1 204 No Content\r\n")
    assert b"content-length" not in f and b"transfer-encoding" not in f and body == b"" and not closed
    assert f[b"x-added"] == [b"/nobody"]


def test_upstream_server_date_reason_and_type_are_kept(gw):
    head, _, _ = ask(gw.port, b"GET /server HTTP/1.1\r\nHost: x\r\n\r\n")
    f = fields_of(head)
    assert head.startswith(b"HTTP/1.1 200 Fine\r\n")
    assert f[b"server"] == [b"upstream/1"] and f[b"date"] == [b"Tue, 01 Jan 2030 00:00:00 GMT"]
    head, _, _ = ask(gw.port, b"GET /typed HTTP/1.1\r\nHost: x\r\n\r\n")
    assert fields_of(head)[b"content-type"] == [b"text/x-up"]


def test_field_bytes_utf8_pass_latin1_becomes_utf8(gw):
    head, _, _ = ask(gw.port, b"GET /latin HTTP/1.1\r\nHost: x\r\n\r\n")
    f = fields_of(head)
    assert f[b"x-utf8"] == [b"caf\xc3\xa9"]
    assert f[b"x-latin"] == [b"caf\xc3\xa9"]  # read as Latin-1, as the header dict did


def test_headers_named_in_connection_and_x_accel_buffering_stay_behind(gw):
    head, _, _ = ask(gw.port, b"GET /named HTTP/1.1\r\nHost: x\r\n\r\n")
    f = fields_of(head)
    assert b"x-private" not in f and f[b"x-public"] == [b"2"] and b"connection" not in f
    head, body, _ = ask(gw.port, b"GET /accel HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"x-accel-buffering" not in fields_of(head) and body == b"ok"


def test_a_field_with_a_line_break_is_never_sent(gw):
    # $uri is decoded: %0d%0a would split the header if it were written as it is.
    head, _, _ = ask(gw.port, b"GET /len%0d%0aX-Injected:%201 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert all(not line.lower().startswith(b"x-injected") for line in head.split(b"\r\n"))


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\rb"])
def test_head_refuses_a_line_break_in_any_field(value):
    # What aiohttp's serialiser refused, Head refuses too: the request then fails with a 500.
    head = Head([(b"X-Up", b"1")], [("X-Extra", value)])
    with pytest.raises(ValueError):
        head.compose(HttpVersion11, True, 200, "OK", 0, no_body=False, head=False)
    with pytest.raises(ValueError):
        Head([], ()).compose(HttpVersion11, True, 200, value, 0, no_body=False, head=False)


def test_head_replaces_extra_headers_at_their_first_place_and_appends_the_rest():
    raw = [(b"A", b"1"), (b"RateLimit-Limit", b"up1"), (b"B", b"2"), (b"ratelimit-limit", b"up2")]
    head = Head(raw, [("RateLimit-Limit", "10"), ("RateLimit-Remaining", "9")])
    data, keep_alive, chunked = head.compose(HttpVersion11, True, 200, "OK", 2, no_body=False, head=False)
    lines = data.split(b"\r\n")
    assert lines[1:5] == [b"A: 1", b"RateLimit-Limit: 10", b"B: 2", b"RateLimit-Remaining: 9"]
    assert keep_alive and not chunked


def test_status_lines_are_remembered_up_to_a_bound_and_each_reason_comes_out_as_sent():
    # The reason phrase is the upstream's own text: any number of them must not grow the cache.
    for i in range(respond.STATUS_LINES_MAX + 100):
        data, _, _ = Head([], ()).compose(HttpVersion11, True, 200, f"R{i}", 0, no_body=False, head=False)
        assert data.startswith(f"HTTP/1.1 200 R{i}\r\n".encode())
    assert respond._status_line.cache_info().currsize <= respond.STATUS_LINES_MAX
    data, _, _ = Head([], ()).compose(HttpVersion10, False, 404, "Not Found", 0, no_body=False, head=False)
    assert data.startswith(b"HTTP/1.0 404 Not Found\r\n")


def test_extra_field_lines_are_remembered_up_to_a_bound_and_each_comes_out_as_given():
    # RateLimit's value changes with every request that spends the bucket: the cache stops growing.
    for i in range(respond.FIELD_CACHE_MAX + 100):
        data, _, _ = Head([(b"X-Up", b"1")], [("RateLimit", f'"z";r={i};t=1')]).compose(
            HttpVersion11, True, 200, "OK", 0, no_body=False, head=False
        )
        assert f'\r\nRateLimit: "z";r={i};t=1\r\n'.encode() in data
    assert respond._field_line.cache_info().currsize <= respond.FIELD_CACHE_MAX
    assert respond._lower_name.cache_info().currsize <= respond.FIELD_CACHE_MAX
