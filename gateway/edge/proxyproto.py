"""The PROXY protocol (v1 and v2) on a listener with ``proxy_protocol``, as nginx reads it.

A TCP load balancer in front (HAProxy's ``send-proxy`` / ``send-proxy-v2``) opens each
connection with a header naming the client it accepted. On a listener that expects one,
``ProxyHeaderReader`` is each connection's first protocol: it reads that header (bounded:
107 bytes for v1, ``16 + length`` for v2 with ``V2_MAX_LENGTH`` the most it accepts) within
``client_header_timeout`` of accept, then hands the connection, with the bytes after the
header, to the edge protocol (plain HTTP) or to the TLS sniffer (the header comes before
the ClientHello). A connection whose first bytes are not a valid header is closed and
logged as nginx does ("broken header").

The header's source is ``$proxy_protocol_addr``; it becomes the client address only with
``real_ip.header: proxy_protocol`` and a peer inside ``real_ip.from`` (``RealIp``). A v1
``UNKNOWN``, a v2 ``LOCAL`` (a balancer's health check) or an address family other than
IPv4 and IPv6 carries no address: the connection's own addresses are used. v2 TLVs are
skipped.

Listeners without ``proxy_protocol`` never meet this module: it costs them nothing.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from gateway.edge.connections import reset
from gateway.http.realip import UNKNOWN, ClientAddr, parse_addr
from gateway.logs import error as errorlog
from gateway.logs.escape import escape

V1_PREFIX = b"PROXY "
V1_MAX = 107  # the whole v1 line, CRLF included (the specification's bound)
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_MAX_LENGTH = 4096  # addresses and TLVs: more than any balancer sends, a bound on what is held


class BrokenHeader(ValueError):
    """The connection's first bytes are not a PROXY protocol header."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """What a header said: the client's address and port (``addr`` None: use the connection's own)."""

    addr: ClientAddr | None
    port: int = 0
    version: int = 1

    @property
    def addr_text(self) -> str:
        """``$proxy_protocol_addr``."""
        return self.addr.text if self.addr is not None else ""

    @property
    def port_text(self) -> str:
        """``$proxy_protocol_port``."""
        return str(self.port) if self.addr is not None else ""


def parse_header(buf: bytes) -> tuple[ProxyHeader, int] | None:
    """The header at the start of ``buf`` and its length, or None if more bytes are needed.

    Raises ``BrokenHeader`` as soon as the bytes cannot start a valid header."""
    if buf[:12] == V2_SIGNATURE[: len(buf)] and buf[:1] == b"\r":
        return _parse_v2(buf)
    if buf[:6] == V1_PREFIX[: len(buf)]:
        return _parse_v1(buf)
    raise BrokenHeader("not a PROXY protocol header")


def _parse_v1(buf: bytes) -> tuple[ProxyHeader, int] | None:
    end = buf.find(b"\r\n", 0, V1_MAX)
    if end < 0:
        if len(buf) >= V1_MAX or b"\n" in buf[:V1_MAX]:
            raise BrokenHeader("v1 line without CRLF within 107 bytes")
        return None
    try:
        line = buf[:end].decode("ascii")
    except UnicodeDecodeError:
        raise BrokenHeader("v1 line is not ASCII") from None
    parts = line.split(" ")
    if len(parts) < 2:
        raise BrokenHeader("v1 line without a protocol")
    if parts[1] == "UNKNOWN":
        return ProxyHeader(None, 0, 1), end + 2
    if len(parts) != 6 or parts[1] not in ("TCP4", "TCP6"):
        raise BrokenHeader("v1 line is not PROXY TCP4|TCP6 SRC DST SPORT DPORT")
    kind = ipaddress.IPv4Address if parts[1] == "TCP4" else ipaddress.IPv6Address
    try:
        src = kind(parts[2])
        kind(parts[3])
    except ValueError:
        raise BrokenHeader("v1 address is invalid") from None
    sport = _port(parts[4])
    _port(parts[5])
    addr = parse_addr(str(src))
    return ProxyHeader(addr, sport, 1), end + 2


def _port(text: str) -> int:
    if not text.isdigit() or not text.isascii() or len(text) > 5 or int(text) > 65535:
        raise BrokenHeader("v1 port is invalid")
    return int(text)


def _parse_v2(buf: bytes) -> tuple[ProxyHeader, int] | None:
    if len(buf) < 16:
        return None
    if buf[:12] != V2_SIGNATURE:
        raise BrokenHeader("v2 signature is invalid")
    ver_cmd, family = buf[12], buf[13]
    length = int.from_bytes(buf[14:16], "big")
    if ver_cmd >> 4 != 2 or ver_cmd & 0x0F > 1:
        raise BrokenHeader("v2 version or command is invalid")
    if length > V2_MAX_LENGTH:
        raise BrokenHeader(f"v2 header longer than {V2_MAX_LENGTH} bytes")
    total = 16 + length
    if len(buf) < total:
        return None
    if ver_cmd & 0x0F == 0:  # LOCAL: the balancer's own connection (a health check)
        return ProxyHeader(None, 0, 2), total
    if family & 0x0F > 2:
        raise BrokenHeader("v2 transport is invalid")
    body = buf[16:total]
    if family >> 4 == 1:  # AF_INET: src, dst, sport, dport
        if length < 12:
            raise BrokenHeader("v2 IPv4 addresses are truncated")
        addr = parse_addr(str(ipaddress.IPv4Address(body[:4])))
        return ProxyHeader(addr, int.from_bytes(body[8:10], "big"), 2), total
    if family >> 4 == 2:  # AF_INET6
        if length < 36:
            raise BrokenHeader("v2 IPv6 addresses are truncated")
        addr = parse_addr(str(ipaddress.IPv6Address(body[:16])))
        return ProxyHeader(addr, int.from_bytes(body[32:34], "big"), 2), total
    return ProxyHeader(None, 0, 2), total  # UNSPEC, UNIX or unknown: the connection's own addresses


class ProxyHeaderReader(asyncio.Protocol):
    """A new connection on a ``proxy_protocol`` listener, until its header is read.

    Counted by the connection limiter from accept (by the balancer's address, which
    ``real_ip.from`` exempts), as a reusable connection: it has made no request progress."""

    def __init__(self, server: Any, make_sniffer: Callable[[], Any] | None = None) -> None:
        self.server = server  # gateway.edge.EdgeServer
        self.make_sniffer = make_sniffer  # on a TLS listener: the TlsSniffer that takes over
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.key: bytes | None = None
        self.peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        self.key = self.server.limiter.admit(self, parse_addr(self.peer) or UNKNOWN)
        if self.key is None:
            reset(self.transport)
            return
        loop = asyncio.get_running_loop()
        self.deadline = loop.time() + float(self.server.settings.client_header_timeout_s)
        self.timer = loop.call_at(self.deadline, self._timed_out)

    def _timed_out(self) -> None:
        self.timer = None
        errorlog.log.info("client timed out while reading PROXY protocol header, client: %s", self.peer)
        if self.transport is not None:
            self.transport.abort()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def release(self) -> None:
        key = self.key
        if key is not None:
            self.key = None
            self.server.limiter.release(self, key)

    def evict(self) -> None:
        """Closed to make room for a new connection (it has not sent its header yet)."""
        self.release()
        self._stop_timer()
        if self.transport is not None:
            reset(self.transport)

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing() or self.key is None:
            return
        buf = self.buf + data
        try:
            parsed = parse_header(buf)
        except BrokenHeader as exc:
            errorlog.log.error(
                'broken header: "%s" while reading PROXY protocol (%s), client: %s',
                escape(buf[:V1_MAX].decode("latin-1")),
                exc,
                self.peer,
            )
            self._stop_timer()
            self.release()
            transport.abort()
            return
        if parsed is None:
            self.buf = buf
            return
        header, used = parsed
        self.buf = b""
        self._stop_timer()
        self._hand_over(transport, header, buf[used:])

    def _hand_over(self, transport: asyncio.Transport, header: ProxyHeader, rest: bytes) -> None:
        key = self.key
        assert key is not None
        self.key = None
        limiter = self.server.limiter
        if self.make_sniffer is not None:
            sniffer = self.make_sniffer()
            limiter.replace(self, sniffer)
            transport.set_protocol(sniffer)
            sniffer.take_over(transport, key, self.deadline, header)
            if rest:
                sniffer.data_received(rest)
            return
        protocol = self.server()
        limiter.replace(self, protocol)
        protocol.adopt(key, proxy=header, deadline=self.deadline)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if rest:
            protocol.data_received(rest)

    def eof_received(self) -> bool | None:
        self._stop_timer()
        if self.key is None or self.transport is None:
            return None
        if self.buf:  # part of a header, then nothing: nginx's "broken header"
            errorlog.log.error(
                'broken header: "%s" while reading PROXY protocol (closed mid-header), client: %s',
                escape(self.buf.decode("latin-1")),
                self.peer,
            )
        else:  # a TCP probe (connect, close): quiet, as nginx's "client closed connection"
            errorlog.log.info(
                "client closed connection while waiting for a PROXY protocol header, client: %s", self.peer
            )
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_timer()
        self.release()


class ProxyProtocolSite(web.SockSite):
    """aiohttp's ``SockSite`` for a plain ``proxy_protocol`` address: each connection starts as
    a ``ProxyHeaderReader``."""

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: ProxyHeaderReader(server), sock=self._sock, backlog=self._backlog
        )
