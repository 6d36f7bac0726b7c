"""TLS termination at run time: which certificate a handshake gets, and how a reload changes it.

Each TLS socket is created once with one ``SSLContext`` (``TlsListener.context``). Its SNI
callback runs in every handshake and hands the connection the context of the *current*
configuration (``SniTable``): the certificate of the ``ssl_certificates`` entry or server
whose name matches the client's SNI name, else the default server's. A reload swaps the
table (and the protocols and ciphers on the listener's context, which new connections copy),
so new certificates apply to the next handshake, while the socket and every established
connection stay as they are.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from gateway.background import spawn
from gateway.config.schema import ConfigSpec
from gateway.config.servers import ServerName, serves
from gateway.config.tls import TlsSpec, apply_settings, server_context
from gateway.edge.connections import reset
from gateway.edge.proxyproto import ProxyHeader, ProxyHeaderReader
from gateway.http.realip import UNKNOWN, parse_addr
from gateway.http.vhosts import NameTable


@dataclass(frozen=True, slots=True)
class SniTable:
    """One TLS address's certificates in one configuration."""

    spec: TlsSpec  # the default server's settings: protocols and ciphers of the handshake
    default: ssl.SSLContext
    names: NameTable[ssl.SSLContext] | None

    def context_for(self, server_name: str | None) -> ssl.SSLContext:
        if server_name is None or self.names is None:
            return self.default
        return self.names.find(server_name.lower())


def sni_tables(spec: ConfigSpec) -> dict[tuple[str, int], SniTable]:
    """Every TLS address's ``SniTable`` (an address whose server has no loaded certificate is
    left out: the configuration carries an error for it)."""
    out: dict[tuple[str, int], SniTable] = {}
    for bound in spec.listen:
        if not bound.ssl:
            continue
        members = [s for s in spec.servers if any(serves(bound, entry) for entry in s.listen)]
        if not members:
            continue
        default_server = next((s for s in members if s.default), members[0])
        default_tls: TlsSpec | None = default_server.tls
        if default_tls is None or default_tls.context is None:
            continue
        entries: list[tuple[tuple[ServerName, ...], bool, ssl.SSLContext]] = []
        for server in members:  # the explicit lists first: they name certificates, not servers
            for cert in server.tls.certificates if server.tls is not None else ():
                if cert.context is not None:
                    entries.append((cert.names, False, cert.context))
        for server in members:
            if server.names and server.tls is not None and server.tls.context is not None:
                entries.append((server.names, False, server.tls.context))
        names: NameTable[ssl.SSLContext] | None = None
        if entries:
            names = NameTable(entries)
            names.default = default_tls.context
        out[bound.address] = SniTable(default_tls, default_tls.context, names)
    return out


class TlsListener:
    """The context a TLS socket was created with, for as long as the socket lives."""

    def __init__(self, table: SniTable) -> None:
        self.table = table
        self.context = server_context(table.spec)
        self.context.sni_callback = self._select

    def update(self, table: SniTable) -> None:
        """A reload: the next handshakes get ``table``'s certificates and settings."""
        if table.spec != self.table.spec:
            apply_settings(self.context, table.spec)  # copied by each new connection, not by live ones
        self.table = table

    def _select(self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> None:
        connection.context = self.table.context_for(server_name)


class TlsSite(web.SockSite):
    """aiohttp's ``SockSite`` for a TLS address: each connection starts as a ``TlsSniffer``."""

    def __init__(
        self, runner: web.BaseRunner, sock: Any, listener: TlsListener, *, proxy_protocol: bool = False, **kw: Any
    ) -> None:
        super().__init__(runner, sock, **kw)
        self.listener = listener
        self.proxy_protocol = proxy_protocol  # a PROXY protocol header comes before the ClientHello

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        listener = self.listener

        def sniffer() -> TlsSniffer:
            return TlsSniffer(server, listener)

        factory: Callable[[], asyncio.Protocol] = sniffer
        if self.proxy_protocol:
            factory = lambda: ProxyHeaderReader(server, sniffer)
        self._server = await asyncio.get_running_loop().create_server(factory, sock=self._sock, backlog=self._backlog)


_BODY = (
    b"<html>\r\n<head><title>400 The plain HTTP request was sent to HTTPS port</title></head>\r\n<body>\r\n"
    b"<center><h1>400 Bad Request</h1></center>\r\n"
    b"<center>The plain HTTP request was sent to HTTPS port</center>\r\n</body>\r\n</html>\r\n"
)
PLAIN_HTTP_ANSWER = (
    b"HTTP/1.1 400 Bad Request\r\nServer: gateway\r\nContent-Type: text/html\r\n"
    + f"Content-Length: {len(_BODY)}\r\n".encode()
    + b"Connection: close\r\n\r\n"
    + _BODY
)
TLS_HANDSHAKE_RECORD = 0x16  # the first byte of every ClientHello


class TlsSniffer(asyncio.Protocol):
    """A new connection on a TLS port, until its first bytes say what it speaks.

    A TLS record (0x16) goes on to the handshake (``loop.start_tls``, those first bytes
    handed to the TLS layer before anything else) and then to the edge protocol, as on any
    listener; anything else is a plain HTTP request and gets nginx's 400 "The plain HTTP
    request was sent to HTTPS port". The first bytes and the handshake together must come
    within ``client_header_timeout``.

    The connection counts against ``max_connections_per_ip`` and the connection budget from
    accept, as a plain one does: until the edge protocol takes it over after the handshake,
    this sniffer is what the limiter counts, and what it may close (as reusable: a handshake
    makes no request progress) when a worker is out of room.
    """

    def __init__(self, server: Any, listener: TlsListener) -> None:
        self.server = server  # gateway.edge.EdgeServer: makes the connection's EdgeProtocol
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.key: bytes | None = None  # the limiter's count, until released or handed over
        self.proxy: ProxyHeader | None = None  # what a PROXY protocol header said, if one came first

    def take_over(self, transport: asyncio.Transport, key: bytes, deadline: float, proxy: ProxyHeader) -> None:
        """Carry on after a PROXY protocol header (``ProxyHeaderReader``), counted and timed from accept."""
        self.transport = transport
        self.key = key
        self.proxy = proxy
        self.deadline = deadline
        self.timer = asyncio.get_running_loop().call_at(deadline, transport.abort)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        loop = asyncio.get_running_loop()
        self.transport = cast(asyncio.Transport, transport)
        peername = transport.get_extra_info("peername")
        peer = parse_addr(peername[0]) if isinstance(peername, tuple) and peername else None
        self.key = self.server.limiter.admit(self, peer or UNKNOWN)
        if self.key is None:
            reset(self.transport)
            return
        self.deadline = loop.time() + float(self.server.settings.client_header_timeout_s)
        self.timer = loop.call_at(self.deadline, self.transport.abort)

    def release(self) -> None:
        """The connection is gone: its counts go back (once, whichever way it ended)."""
        key = self.key
        if key is not None:
            self.key = None
            self.server.limiter.release(self, key)

    def evict(self) -> None:
        """Closed to make room for a new connection (still in its handshake, or being told it
        sent plain HTTP)."""
        self.release()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            reset(self.transport)

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if data[0] == TLS_HANDSHAKE_RECORD:
            transport.pause_reading()
            spawn(self._handshake(data))
        else:
            answer = PlainHttpAnswer(transport, self.deadline, self.release)
            transport.set_protocol(answer)
            answer.data_received(data)

    async def _handshake(self, first: bytes) -> None:
        transport = self.transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        held = HeldProtocol()
        upgrade = asyncio.ensure_future(
            loop.start_tls(
                transport,
                held,
                self.listener.context,
                server_side=True,
                ssl_handshake_timeout=max(self.deadline - loop.time(), 0.001),
            )
        )
        await asyncio.sleep(0)  # start_tls has put its TLS protocol on the transport
        tls_protocol = transport.get_protocol()
        # start_tls schedules the TLS protocol's connection_made, then resumes reading; the
        # bytes already read go in right after, before anything more is read.
        loop.call_soon(_replay, tls_protocol, first)
        try:
            tls = await upgrade
        except (OSError, EOFError, asyncio.CancelledError, ValueError):  # a failed handshake: closed, quietly
            transport.abort()
            self.release()
            return
        key = self.key
        if tls is None or key is None:  # no TLS transport, or evicted as the handshake ended
            transport.abort()
            self.release()
            return
        protocol = self.server()
        self.key = None
        self.server.limiter.replace(self, protocol)
        protocol.adopt(key, proxy=self.proxy)
        held.hand_over(tls, protocol)

    def eof_received(self) -> bool | None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.release()


def _replay(protocol: Any, data: bytes) -> None:
    """Give a (buffered) protocol bytes that were read before it took over the transport."""
    while data:
        view = protocol.get_buffer(len(data))
        n = min(len(view), len(data))
        view[:n] = data[:n]
        protocol.buffer_updated(n)
        data = data[n:]


class HeldProtocol(asyncio.Protocol):
    """The application side during a handshake: keeps what arrives until the edge protocol
    takes the connection (the TLS layer may deliver data before ``start_tls`` returns)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.eof = False
        self.lost: tuple[Exception | None] | None = None

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)

    def eof_received(self) -> bool | None:
        self.eof = True
        # Under TLS the connection closes after an EOF whatever this returns (True only earns
        # asyncio's "has no effect when using ssl" warning, once per probe): the edge protocol
        # is told of the EOF when it takes over.
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = (exc,)

    def hand_over(self, transport: asyncio.Transport, protocol: asyncio.Protocol) -> None:
        transport.set_protocol(protocol)
        protocol.connection_made(transport)  # start_tls makes no connection_made call of its own
        for chunk in self.chunks:
            protocol.data_received(chunk)
        if self.eof and protocol.eof_received() is not True:
            transport.close()
        if self.lost is not None:
            protocol.connection_lost(self.lost[0])


class PlainHttpAnswer(asyncio.Protocol):
    """Reads a plain HTTP request's header (up to 16 KiB), answers 400 and closes."""

    def __init__(self, transport: asyncio.Transport, deadline: float, on_lost: Callable[[], None]) -> None:
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_at(deadline, transport.abort)  # client_header_timeout
        self.seen = b""
        self.on_lost = on_lost  # gives the connection's count back

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        self.seen = (self.seen + data)[-16384:]
        if b"\r\n\r\n" in self.seen or len(self.seen) >= 16384:
            self.transport.pause_reading()
            self.transport.write(PLAIN_HTTP_ANSWER)
            self.transport.close()

    def eof_received(self) -> bool | None:
        if not self.transport.is_closing():
            self.transport.write(PLAIN_HTTP_ANSWER)
        return None  # closed once the answer is written

    def connection_lost(self, exc: BaseException | None) -> None:
        self.timer.cancel()
        self.on_lost()
