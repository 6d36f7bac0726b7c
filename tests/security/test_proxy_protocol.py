"""PROXY protocol on a listener, from raw sockets: what a valid header gives, and that anything
else (no header, a malformed, oversized or slow one) closes the connection and is logged.

The gateway runs through its CLI with ``listen: "127.0.0.1:PORT proxy_protocol"``; a return
route answers ``$remote_addr``, ``$proxy_protocol_addr`` and ``$proxy_protocol_port`` so each
case reads what the gateway took the client to be. ``parse_header`` is also checked directly.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable

import pytest

from gateway.edge.proxyproto import V2_SIGNATURE, BrokenHeader, parse_header
from gateway.http.realip import parse_addr

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def pp_config(trusted: str = "127.0.0.1/32", extra: str = "") -> Callable[[int], str]:
    def build(port: int) -> str:
        return f"""
listen: "127.0.0.1:{port} proxy_protocol"
admin: {{listen: "off"}}
client_header_timeout: 1s
real_ip: {{from: [{trusted}], header: proxy_protocol}}
routes:
  - location: /
    return: {{code: 200, text: "ra=$remote_addr ppa=$proxy_protocol_addr ppp=$proxy_protocol_port"}}
{extra}"""

    return build


def v2(command: int, family: int, body: bytes) -> bytes:
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack(">H", len(body)) + body


def v2_ipv4(src: str, dst: str, sport: int, dport: int, tlvs: bytes = b"") -> bytes:
    body = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack(">HH", sport, dport) + tlvs
    return v2(1, 0x11, body)


def v2_ipv6(src: str, dst: str, sport: int, dport: int) -> bytes:
    body = socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst)
    return v2(1, 0x21, body + struct.pack(">HH", sport, dport))


def exchange(port: int, *chunks: bytes, pause: float = 0.0, timeout: float = 5.0) -> bytes:
    """Send ``chunks`` (``pause`` between them), then read until the gateway closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            for i, chunk in enumerate(chunks):
                if i and pause:
                    time.sleep(pause)
                sock.sendall(chunk)
        except OSError:
            pass
        out = b""
        try:
            while data := sock.recv(65536):
                out += data
        except OSError:
            pass
        return out


def body(answer: bytes) -> str:
    return answer.partition(b"\r\n\r\n")[2].decode()


# -- the parser ----------------------------------------------------------------------------------------


def test_parse_v1_and_v2_headers() -> None:
    line = b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 8080\r\n"
    header, used = parse_header(line + b"GET") or (None, 0)
    assert header is not None and header.addr == parse_addr("203.0.113.7") and header.port == 51234
    assert used == len(line)
    header, used = parse_header(b"PROXY TCP6 2001:db8::5 2001:db8::1 1 2\r\n") or (None, 0)
    assert header is not None and header.addr_text == "2001:db8::5"
    header, _ = parse_header(b"PROXY UNKNOWN\r\n") or (None, 0)
    assert header is not None and header.addr is None and header.addr_text == ""
    raw = v2_ipv4("198.51.100.9", "10.0.0.1", 4000, 443, tlvs=b"\x01\x00\x02h2")  # an ALPN TLV, skipped
    header, used = parse_header(raw + b"rest") or (None, 0)
    assert header is not None and header.addr_text == "198.51.100.9" and header.port == 4000 and used == len(raw)
    header, _ = parse_header(v2(0, 0x00, b"")) or (None, 0)  # LOCAL: the real addresses
    assert header is not None and header.addr is None


@pytest.mark.parametrize("partial", [b"P", b"PROXY TCP4 1.2.3.4", V2_SIGNATURE[:5], V2_SIGNATURE + b"\x21\x11\x00"])
def test_parse_waits_for_the_rest(partial: bytes) -> None:
    assert parse_header(partial) is None


@pytest.mark.parametrize(
    "raw",
    [
        b"GET / HTTP/1.1\r\n\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
        b"PROXY TCP4 1.2.3.999 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 2001:db8::1 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n",
        b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
        b"PROXY " + b"1" * 120,
        V2_SIGNATURE + b"\x31\x11\x00\x0c" + bytes(12),  # version 3
        V2_SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12),  # command 2
        V2_SIGNATURE + b"\x21\x11\x00\x04" + bytes(4),  # IPv4 addresses cut short
        V2_SIGNATURE + b"\x21\x11\xff\xff",  # longer than the cap
        b"\r\n\r\n\x00\r\nQUIX\n\x21\x11\x00\x0c" + bytes(12),
    ],
)
def test_parse_refuses_broken_headers(raw: bytes) -> None:
    with pytest.raises(BrokenHeader):
        parse_header(raw)


# -- the listener ----------------------------------------------------------------------------------------


def test_v1_header_names_the_client_of_a_trusted_peer(gateway_factory) -> None:
    gw = gateway_factory(pp_config())
    answer = exchange(gw.port, b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 8080\r\n" + REQUEST)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert body(answer) == "ra=203.0.113.7 ppa=203.0.113.7 ppp=51234"


def test_header_and_request_in_separate_packets(gateway_factory) -> None:
    gw = gateway_factory(pp_config())
    answer = exchange(
        gw.port, b"PROXY TCP4 203.0", b".113.8 10.0.0.1 1 2\r\nGET / HT", b"TP/1.1\r\nHost: x\r\n\r\n", pause=0.1
    )
    assert body(answer) == "ra=203.0.113.8 ppa=203.0.113.8 ppp=1"


def test_v2_ipv6_and_keepalive(gateway_factory) -> None:
    gw = gateway_factory(pp_config())
    keep = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = exchange(gw.port, v2_ipv6("2001:db8::7", "2001:db8::1", 9, 80) + keep, keep + REQUEST, pause=0.2)
    assert answer.count(b"HTTP/1.1 200") == 3
    assert answer.count(b"ra=2001:db8::7 ppa=2001:db8::7 ppp=9") == 3


def test_v2_local_uses_the_connection_addresses(gateway_factory) -> None:
    gw = gateway_factory(pp_config())
    answer = exchange(gw.port, v2(0, 0x00, b"") + REQUEST)
    assert body(answer) == "ra=127.0.0.1 ppa= ppp="


def test_untrusted_peer_header_is_not_used(gateway_factory) -> None:
    gw = gateway_factory(pp_config(trusted="192.0.2.0/24"))
    answer = exchange(gw.port, v2_ipv4("203.0.113.7", "10.0.0.1", 5, 6) + REQUEST)
    assert body(answer) == "ra=127.0.0.1 ppa=203.0.113.7 ppp=5"


@pytest.mark.parametrize(
    "first",
    [
        REQUEST,  # no header at all
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n" + REQUEST,  # malformed
        b"PROXY " + b"9" * 200 + b"\r\n" + REQUEST,  # over 107 bytes
        V2_SIGNATURE + b"\x21\x11\x40\x00" + bytes(16384) + REQUEST,  # v2 over the cap
    ],
)
def test_without_a_valid_header_the_connection_is_closed(gateway_factory, first: bytes) -> None:
    gw = gateway_factory(pp_config())
    assert exchange(gw.port, first) == b""
    deadline = time.monotonic() + 3
    while "broken header" not in gw.stderr() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "broken header" in gw.stderr()
    # The gateway keeps serving.
    assert body(exchange(gw.port, b"PROXY UNKNOWN\r\n" + REQUEST)) == "ra=127.0.0.1 ppa= ppp="


@pytest.mark.timing
def test_a_slow_header_meets_client_header_timeout(gateway_factory) -> None:
    gw = gateway_factory(pp_config())
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(b"PROXY TCP4 ")
        for _ in range(40):  # a byte every 50 ms, never finishing within the 1 s budget
            try:
                sock.sendall(b"1")
            except OSError:
                break
            time.sleep(0.05)
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(100) == b""
    assert time.monotonic() - started < 3.5


@pytest.mark.timing
def test_header_time_counts_towards_the_request_header(gateway_factory) -> None:
    """client_header_timeout runs from accept, not from the end of the PROXY header."""
    gw = gateway_factory(pp_config())
    started = time.monotonic()
    answer = exchange(gw.port, b"PROXY UNKNOWN\r\n", b"GET / HTTP/1.1\r\n", b"Host: x\r\n", pause=0.6)
    assert b"200" not in answer.split(b"\r\n", 1)[0]
    assert time.monotonic() - started < 2.5
