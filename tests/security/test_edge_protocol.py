"""What the gateway answers to request lines and headers a hostile or odd client sends.

Each case goes over a real socket to the gateway started through its CLI; the
expected answers are nginx's where nginx defines them (checked against nginx 1.22:
505 for HTTP/2.0 and up, 414 for an over-long request line, 400 for CONNECT,
PRI and lower-case methods; custom upper-case methods are proxied), and the
issue's where it decides otherwise (HTTP/0.9 gets 400, HTTP/1.2 gets 505, an
over-long header gets 431).
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator

import pytest

from gateway import __version__
from tests.support.config import basic_config
from tests.support.http import exchange
from tests.support.ports import free_port
from tests.support.upstreams import HeadEchoUpstream


def status_of(response: bytes) -> tuple[str, int]:
    line = response.split(b"\r\n", 1)[0].decode("latin-1")
    version, code = line.split(" ", 2)[:2]
    return version, int(code)


def body_of(response: bytes) -> bytes:
    return response.split(b"\r\n\r\n", 1)[1]


@pytest.fixture
def raw_upstream() -> Iterator[HeadEchoUpstream]:
    up = HeadEchoUpstream().start()
    yield up
    up.stop()


@pytest.fixture
def gw(gateway_factory, raw_upstream):
    return gateway_factory(lambda port: basic_config(port, [raw_upstream.address]))


LONG_QUERY = b"GET /?q=" + b"y" * 60_000 + b" HTTP/1.1\r\nHost: a\r\n\r\n"
LONG_HEADER = b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + b"z" * 9000 + b"\r\n\r\n"
MANY_HEADERS = (
    b"GET / HTTP/1.1\r\nHost: a\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"w" * 7000) for i in range(6)) + b"\r\n"
)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /x HTTP/2.0\r\nHost: a\r\n\r\n", 505),
        (b"GET /x HTTP/3.0\r\nHost: a\r\n\r\n", 505),
        (b"GET /x HTTP/1.2\r\nHost: a\r\n\r\n", 505),
        (b"GET /x\r\n", 400),  # HTTP/0.9
        (b"GET /x HTTP/0.9\r\n\r\n", 400),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
        (b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 400),
        (b"brew /x HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (LONG_QUERY, 414),
        (LONG_HEADER, 431),
        (MANY_HEADERS, 431),  # each line fits in 8k, the whole header does not fit in 4 x 8k
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40, 400),  # TLS on the plain port
    ],
)
@pytest.mark.timing
def test_odd_request_lines_get_a_clear_answer_that_echoes_nothing(gw, raw_upstream, request_bytes, status):
    started = time.monotonic()
    response = exchange(gw.port, request_bytes)
    assert time.monotonic() - started < 3, "the gateway must answer, not wait for more"
    assert status_of(response) == ("HTTP/1.1", status)
    head, body = response.split(b"\r\n\r\n", 1)
    assert b"\r\nConnection: close" in head
    assert b"\r\nServer: gateway\r\n" in head + b"\r\n"
    for fragment in (b"yyyyyyyy", b"zzzzzzzz", b"wwwwwwww", b"brew", b"HTTP/2", b"PRI", b"example.com"):
        assert fragment not in body, f"the error body reflects request bytes: {body[:200]!r}"
    assert raw_upstream.heads == [], "nothing reaches the upstream"
    assert gw.proc is not None and gw.proc.poll() is None


def test_custom_token_methods_are_proxied_like_nginx(gw, raw_upstream):
    response = exchange(gw.port, b"BREW /pot?x=1 HTTP/1.1\r\nHost: tea\r\nConnection: close\r\n\r\n")
    assert status_of(response) == ("HTTP/1.1", 200)
    seen = json.loads(body_of(response))
    assert (seen["method"], seen["target"]) == ("BREW", "/pot?x=1")
    # Sent a byte at a time, a method is only known when whole: it must still be proxied.
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.settimeout(5)
        for byte in b"MKREDIRECTREF /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc":
            sock.sendall(bytes([byte]))
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    assert status_of(response)[1] == 200
    seen = json.loads(body_of(response))
    assert (seen["method"], seen["body"]) == ("MKREDIRECTREF", 3)


def test_a_custom_method_after_a_keep_alive_request(gw, raw_upstream):
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.settimeout(5)
        first = sock.makefile("rb")
        sock.sendall(b"GET /one HTTP/1.1\r\nHost: a\r\n\r\n")
        assert first.readline().startswith(b"HTTP/1.1 200")
        length = 0
        while (line := first.readline()) != b"\r\n":
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        first.read(length)
        sock.sendall(b"PURGE-ALL /two HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        assert first.readline().startswith(b"HTTP/1.1 200")
    assert [h["method"] for h in raw_upstream.heads] == ["GET", "PURGE-ALL"]


def test_a_request_body_that_spells_a_request_is_not_parsed_as_one(gw, raw_upstream):
    """Smuggling attempt: the body of a keep-alive POST reads like a custom-method request."""
    inner = b"SMUGGLE /admin HTTP/1.1\r\nHost: a\r\n\r\n"
    outer = b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(inner)
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.settimeout(5)
        sock.sendall(outer)
        time.sleep(0.05)
        sock.sendall(inner)  # the body arrives in its own packet, at what looks like a boundary
        time.sleep(0.2)
        sock.sendall(b"GET /after HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert [(h["method"], h["target"]) for h in raw_upstream.heads] == [("POST", "/upload"), ("GET", "/after")]
    assert raw_upstream.heads[0]["body"] == len(inner)


def test_absolute_form_target_sets_host_and_reaches_upstream_in_origin_form(gateway_factory, raw_upstream):
    gw = gateway_factory(
        lambda port: basic_config(port, [raw_upstream.address]) + 'log: {format: "$host|$request_uri|$request"}\n'
    )
    response = exchange(
        gw.port, b"GET http://Example.COM:81/get?q=1 HTTP/1.1\r\nHost: other\r\nConnection: close\r\n\r\n"
    )
    assert status_of(response)[1] == 200
    seen = json.loads(body_of(response))
    assert seen["target"] == "/get?q=1"
    assert ("Host", "Example.COM:81") in [tuple(h) for h in seen["headers"]]
    assert gw.access_lines()[-1] == "example.com|/get?q=1|GET http://Example.COM:81/get?q=1 HTTP/1.1"


def test_http10_without_host_sends_the_upstreams_own_host(gw, raw_upstream):
    response = exchange(gw.port, b"GET /old HTTP/1.0\r\n\r\n")
    assert status_of(response) == ("HTTP/1.0", 200)
    hosts = [v for k, v in json.loads(body_of(response))["headers"] if k == "Host"]
    assert hosts == [raw_upstream.address]


def test_client_values_in_the_error_log_cannot_forge_fields(gateway_factory, raw_upstream):
    gw = gateway_factory(
        lambda port: basic_config(port, [raw_upstream.address]) + "access: {deny: [127.0.0.1]}\nlog: {level: info}\n"
    )
    # A host nginx would refuse (it has spaces): the refusal's error-log line carries it, escaped.
    exchange(gw.port, b'GET /a"b HTTP/1.1\r\nHost: x", client: 6.6.6.6\r\nConnection: close\r\n\r\n')
    time.sleep(0.3)
    lines = [line for line in gw.stderr().splitlines() if "invalid host header" in line]
    assert len(lines) == 1
    unquoted = re.sub(r'"(?:[^"\\]|\\.)*"', '""', lines[0])  # the fields outside quoted values
    assert "6.6.6.6" not in unquoted and unquoted.count("client: ") == 1
    assert 'host: "x\\x22, client: 6.6.6.6"' in lines[0]
    assert 'request: "GET /a\\x22b HTTP/1.1"' in lines[0]


def test_the_server_header_never_names_aiohttp(gateway_factory, raw_upstream):
    admin = free_port()

    def config(port: int) -> str:
        return basic_config(port, ["127.0.0.1:1"]) + f"admin: {{listen: 127.0.0.1:{admin}, token: t}}\n"

    gw = gateway_factory(config)
    for port, raw in (
        (gw.port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),  # 502 of our own
        (gw.port, b"GET /%zz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),  # 400
        (gw.port, b"\x00\x01garbage\r\n\r\n"),  # unparsable
        (admin, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
    ):
        head = exchange(port, raw).split(b"\r\n\r\n", 1)[0]
        servers = re.findall(rb"\r\nServer: ([^\r]*)", head)
        assert servers == [b"gateway"], head


def test_server_tokens_on_adds_the_version(gateway_factory, raw_upstream):
    gw = gateway_factory(lambda port: basic_config(port, ["127.0.0.1:1"]) + "server_tokens: on\n")
    head = exchange(gw.port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").split(b"\r\n\r\n")[0]
    assert f"\r\nServer: gateway/{__version__}".encode() in head


def test_proxied_responses_keep_the_upstreams_server_header(gateway_factory, upstream):
    gw = gateway_factory(lambda port: basic_config(port, [upstream.address]))
    head = exchange(gw.port, b"GET /echo HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").split(b"\r\n\r\n")[0]
    assert b"\r\nServer: Python/" in head  # the test upstream is aiohttp: its header passes as it was


def test_custom_methods_pipelined_in_one_packet_are_each_proxied(gw, raw_upstream):
    wire = (
        b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"
        b"BREW /b HTTP/1.1\r\nHost: h\r\n\r\n"
        b"POST /c HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nBREW"  # a body that spells a method
        b"PURGE-X /d HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    )
    response = exchange(gw.port, wire)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", response) == [b"200"] * 4
    assert [(h["method"], h["target"], h["body"]) for h in raw_upstream.heads] == [
        ("GET", "/a", 0),
        ("BREW", "/b", 0),
        ("POST", "/c", 4),
        ("PURGE-X", "/d", 0),
    ]


def test_a_custom_method_split_across_packets_behind_a_request(gw, raw_upstream):
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nMKWO")
        time.sleep(0.2)
        sock.sendall(b"RKSPACE /b HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", data) == [b"200", b"200"]
    assert [h["method"] for h in raw_upstream.heads] == ["GET", "MKWORKSPACE"]
