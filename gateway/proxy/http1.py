"""A lean HTTP/1.1 client for talking to upstreams (plain requests and WebSocket handshakes).

It does one thing, for the proxy: send a request head and a body on a pooled
keep-alive connection, hand back the response head, and feed the response body
into the exchange's ``ResponseSpool``. When the response is complete the
connection lets go of the spool and goes back to its pool (or is closed) at
once, however slowly the spool is drained to the client. Response framing
(Content-Length, chunked, close-delimited, 1xx, 204/304) is parsed by httptools
(llhttp). Compared with aiohttp's client there is no per-request session
machinery, cookie, redirect or tracing logic.

One response per request: bytes after a complete response (a second response,
or garbage) are never read as part of anything; they are logged and the
connection is closed, as nginx does. A request that asked to switch protocols
(``expect_upgrade``) and got a 101 hands its connection over (``detach``).

Timeouts, like nginx: ``connect`` bounds the TCP/TLS handshake; ``read`` bounds
the wait for the response head and the gap between two reads of the body;
``send`` bounds a stalled write of the request body.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterable, Sequence
from typing import Any

import httptools

from gateway.config.tls import MAX_PEM_BYTES
from gateway.config.upstreams import ServerSpec
from gateway.files import read_bounded
from gateway.logs import error as errorlog
from gateway.proxy.spool import ResponseSpool

MAX_HEADER_BYTES = 64 * 1024  # a larger response header is refused, like nginx's proxy_buffer_size
_EOF = b""


class UpstreamFailure(Exception):
    """The exchange failed; ``timeout`` tells a timeout (504) from an error (502)."""

    timeout = False
    phase = "exchange"


class ConnectFailed(UpstreamFailure):
    phase = "connect"


class ConnectTimedOut(ConnectFailed):
    timeout = True


class ReadTimedOut(UpstreamFailure):
    timeout = True
    phase = "read"


class SendTimedOut(UpstreamFailure):
    timeout = True
    phase = "send"


class Disconnected(UpstreamFailure):
    """The upstream closed or reset the connection, or sent something that is not HTTP."""


class StaleConnection(Disconnected):
    """A pooled connection died before answering anything (the upstream's keep-alive ended)."""


class _HeadOnly(Exception):
    """Raised from the parser callback to stop after a HEAD response's header."""


class _HeaderTooBig(Exception):
    pass


class _ExtraData(Exception):
    """A message began after the final response was complete."""


class _UnexpectedSwitch(Exception):
    """A 101 to a request that did not ask to switch protocols."""


class _Answered(Exception):
    """The upstream answered (and closed) before it had the whole request body."""


class ResponseHead:
    __slots__ = ("headers", "reason", "status", "version")

    def __init__(self, status: int, reason: str, headers: list[tuple[bytes, bytes]], version: str) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.version = version


class Connection(asyncio.Protocol):
    """One upstream connection; reusable after a complete exchange with keep-alive."""

    def __init__(self, pool: PeerPool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        # The parser holds this protocol's callbacks, so the two make a cycle: it exists only
        # while connected (a refused connect never makes one; connection_lost drops it),
        # and a connection's end frees both at once, not by the cyclic collector.
        self.parser: httptools.HttpResponseParser
        self.closed = False
        self.used = 0  # exchanges completed on this connection
        self.idle_since = 0.0
        self._head_only = False
        self._until_eof = False  # the response body is delimited by the connection's end
        self._keep_alive = False
        self._status_reason = b""
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self._length_header = False  # Content-Length or Transfer-Encoding among _raw_headers
        self._head: asyncio.Future[ResponseHead] | None = None
        self._body: ResponseSpool | None = None  # where the response body goes, until it is complete
        self._request_sent = False
        self._reading_paused = False
        self._complete = False
        self._received = False  # any byte of the current response
        self._error: UpstreamFailure | None = None
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._body_cut = False  # the request body was not sent whole: never reuse
        self._upgrade_expected = False  # the request asked to switch protocols (WebSocket)
        self._switch_head: ResponseHead | None = None  # a 101 whose tunnel bytes follow
        self._tunnel_head = b""  # tunnel bytes that came with (or after) the 101, until detach()

    # -- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        if self._switch_head is not None:
            self._tunnel_head += data  # the tunnel's, kept until detach()
            return
        if self._head is None:
            # Bytes on an idle connection belong to no request (nginx closes it too):
            # keeping them would hand them to the next request on this connection.
            self._discard_extra()
            self.pool.forget(self)
            return
        self._received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._switched(data[exc.args[0] :])
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _ExtraData):
                self._discard_extra()
            elif isinstance(cause, _HeaderTooBig):
                self._fail(Disconnected("upstream sent too big header"))
            elif isinstance(cause, _UnexpectedSwitch):
                self._fail(Disconnected("upstream sent 101 to a request that did not ask to switch protocols"))
            elif not self._head_only:
                self._fail(Disconnected("upstream response could not be handled"))
        except httptools.HttpParserError as exc:
            if self._complete:
                self._discard_extra()  # garbage after a complete response: the response stands
            else:
                self._fail(Disconnected(f"upstream sent an invalid response ({exc})"))

    def _discard_extra(self) -> None:
        """Bytes after the complete response: never part of it, nor of the next one."""
        errorlog.log.warning(
            'upstream sent more data than the response while reading upstream, upstream: "%s:%d"',
            self.pool.host,
            self.pool.port,
        )
        self.close()

    def _switched(self, tail: bytes) -> None:
        """The upstream switched protocols: what follows the 101 is the tunnel's."""
        head = self._switch_head
        if head is None or self._head is None or self._head.done():
            self._fail(Disconnected("upstream switched protocols unasked"))
            return
        if self.transport is not None:
            self.transport.pause_reading()  # until the tunnel takes the connection over
        self._tunnel_head = tail
        self._head.set_result(head)

    def eof_received(self) -> bool | None:
        self._on_eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._on_eof()
        if self._drain is not None and not self._drain.done():
            answered = self._head is not None and self._head.done()
            self._drain.set_exception(
                _Answered() if answered else Disconnected("upstream closed the connection while we sent the body")
            )
        self.pool.forget(self)
        self.__dict__.pop("parser", None)  # (none if a TLS handshake failed before connection_made)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- httptools callbacks ------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._complete:
            raise _ExtraData()  # a second response (or garbage) after the final one

    def on_status(self, status: bytes) -> None:
        self._status_reason = status

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > MAX_HEADER_BYTES:
            raise _HeaderTooBig()
        self._raw_headers.append((name, value))
        size = len(name)  # only names of 14 or 17 bytes are worth lowering here
        if (size == 14 or size == 17) and name.lower() in (b"content-length", b"transfer-encoding"):
            self._length_header = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._raw_headers = []  # 100 Continue, 103 Early Hints: the real answer follows
            self._length_header = False
            return
        head = ResponseHead(
            status, self._status_reason.decode("latin-1"), self._raw_headers, self.parser.get_http_version()
        )
        upgrade_expected = self._upgrade_expected
        self._upgrade_expected = False  # one request's wish, not the connection's
        if status == 101:
            if not upgrade_expected:
                raise _UnexpectedSwitch()
            self._switch_head = head  # handed out once llhttp confirms the switch (HttpParserUpgrade)
            self._raw_headers = []
            self._header_bytes = 0
            self._length_header = False
            return
        self._until_eof = not (self._length_header or status in (204, 304))
        self._raw_headers = []
        self._header_bytes = 0
        self._length_header = False
        if self._head is not None and not self._head.done():
            self._head.set_result(head)
        if self._head_only:
            self._complete = True
            raise _HeadOnly()

    def on_body(self, body: bytes) -> None:
        if self._body is not None:
            self._body.feed(body)

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() < 200:
            return
        if self._head is None:  # a response nobody asked for (after the one we read): never reuse
            self._close_transport()
            self.pool.forget(self)
            return
        self._complete = True
        # llhttp resets its state once feed_data() returns: ask now, not later
        self._keep_alive = self.parser.should_keep_alive()
        # The whole response is in its spool: the connection is free now, however slowly
        # the client reads. If the upstream answered before it had the whole request, the
        # connection is closed instead (the sender sees that and stops).
        if not self._request_sent:
            self._body_cut = True
            self._end_body(None)
            self._close_transport()
            return
        self.finish()

    # -- the response body's producer (for ResponseSpool) ------------------------------------------------
    def pause_body(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_body(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    # -- internals ------------------------------------------------------------------------------------
    def _end_body(self, error: UpstreamFailure | None) -> None:
        """The response body is complete (the spool is let go of), or failed (it stays
        attached: the exchange's owner still finishes or abandons the connection)."""
        body = self._body
        if body is None:
            return
        if error is None:
            self._body = None
            body.end()
        else:
            body.fail(error)

    def _fail(self, error: UpstreamFailure) -> None:
        if self._error is None:
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._end_body(self._error)
        self._close_transport()

    def _on_eof(self) -> None:
        if self._complete:
            return
        if self._head is not None and not self._head.done():
            stale = self.used > 0 and not self._received
            error = StaleConnection if stale else Disconnected
            self._head.set_exception(error("upstream closed the connection before answering"))
        elif self._head is not None and self._error is None:
            if self._until_eof:
                self._complete = True  # the end of a close-delimited body
            else:
                self._error = Disconnected("upstream closed the connection in the middle of the body")
        if self._body is not None:
            self._end_body(None if self._complete else self._error or Disconnected("upstream closed the connection"))

    def _close_transport(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        """Close the connection; whatever exchange it carried is abandoned."""
        head = self._head
        if head is not None:
            # Nobody will wait for this exchange's answer any more: settle its future now, so
            # that the end of the connection does not leave an exception nobody retrieves.
            if not head.done():
                head.cancel()
            elif not head.cancelled():
                head.exception()
        self._end_body(Disconnected("upstream connection closed"))
        self._body = None
        self._close_transport()

    # -- switching protocols ----------------------------------------------------------------------------
    def expect_upgrade(self) -> None:
        """The next request asks to switch protocols: a 101 answer is the tunnel's start, not an error."""
        self._upgrade_expected = True

    def detach(self, protocol: asyncio.BaseProtocol) -> tuple[asyncio.Transport | None, bytes]:
        """After a 101: hand the transport (reading paused) to ``protocol``, with the tunnel bytes
        received so far. The transport is None when the upstream is gone already."""
        tail, self._tunnel_head = self._tunnel_head, b""
        transport, self.transport = self.transport, None
        self.closed = True  # never pooled again; close() no longer touches the transport
        # The tunnel gets connection_lost now, not us: let go of what held us in cycles.
        self.__dict__.pop("parser", None)
        self._body = None  # (the spool, whose producer we are: a 101 has no body to feed)
        if transport is None or transport.is_closing():
            return None, tail
        transport.set_protocol(protocol)
        return transport, tail

    # -- one exchange -----------------------------------------------------------------------------------
    async def send(
        self,
        head: bytes,
        body: AsyncIterable[bytes] | None,
        chunked: bool,
        send_timeout: float,
        response_body: ResponseSpool,
    ) -> None:
        """Send the request; the response's body will go to ``response_body``. An upstream
        that answers before it has read the whole body (an early 413 or 403, say) gets its
        answer relayed; the connection is not reused."""
        self._head_only = head.startswith(b"HEAD ")
        self._head = self.loop.create_future()
        self._complete = False
        self._keep_alive = False
        self._received = False
        self._error = None
        self._body = response_body
        response_body.attach(self)
        self._request_sent = False
        self._body_cut = False
        self._write(head)
        if body is None:
            self._request_sent = True
            return
        try:
            async for chunk in body:
                if self._head.done():
                    self._body_cut = True  # the upstream has answered already: stop sending
                    return
                if not chunk:
                    continue
                if chunked:
                    self._write(b"%x\r\n" % len(chunk), chunk, b"\r\n")
                else:
                    self._write(chunk)
                if self._write_paused:
                    await self._wait_drain(send_timeout)
            if chunked:
                self._write(b"0\r\n\r\n")
            self._request_sent = True
        except _Answered:
            self._body_cut = True

    def _write(self, *data: bytes) -> None:
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            if self._head is not None and self._head.done():
                self._body_cut = True  # it answered, then closed: the answer is what counts
                raise _Answered()
            raise (StaleConnection if self.used and not self._received else Disconnected)(
                "upstream closed the connection while we sent the request"
            )
        if len(data) == 1:
            transport.write(data[0])
        else:
            transport.writelines(data)

    async def _wait_drain(self, send_timeout: float) -> None:
        if self.closed:
            if self._head is not None and self._head.done():
                raise _Answered()
            raise Disconnected("upstream closed the connection while we sent the body")
        self._drain = self.loop.create_future()
        timer = self.loop.call_later(
            send_timeout, _expire, self._drain, SendTimedOut("upstream did not read the body in time")
        )
        try:
            await self._drain
        finally:
            timer.cancel()
            self._drain = None

    async def read_head(self, read_timeout: float) -> ResponseHead:
        head = self._head  # (the connection may be back in its pool before this returns)
        assert head is not None
        if head.done():
            return head.result()
        timer = self.loop.call_later(
            read_timeout, _expire, head, ReadTimedOut("upstream timed out while reading response header")
        )
        try:
            return await head
        finally:
            timer.cancel()

    def finish(self) -> None:
        """After an exchange: back to the pool if it can carry another request, else closed."""
        reusable = (
            self._complete
            and not self.closed
            and not self._head_only
            and self._error is None
            and self._keep_alive
            and not self._body_cut
        )
        self._head = None
        self._end_body(None if self._complete else self._error or Disconnected("exchange ended early"))
        self._body = None
        self.resume_body()  # an idle connection must see the upstream's close
        if reusable:
            self.used += 1
            self.pool.release(self)
        else:
            self.close()


def _expire(future: asyncio.Future[Any], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


class PeerPool:
    """Idle keep-alive connections to one upstream server."""

    def __init__(
        self, upstream: UpstreamConnections, host: str, port: int, path: str | None, server_hostname: str | None
    ) -> None:
        self.upstream = upstream
        self.host = host
        self.port = port
        self.path = path  # a Unix-domain socket (host and port unused)
        self.server_hostname = server_hostname
        self.idle: collections.deque[Connection] = collections.deque()

    async def acquire(self, connect_timeout: float, *, fresh: bool = False) -> Connection:
        """An idle pooled connection, or a new one (always new with ``fresh``)."""
        keepalive_timeout = self.upstream.keepalive_timeout
        now = time.monotonic()
        while self.idle and not fresh:
            conn = self.idle.pop()  # most recently used: the least likely to have timed out
            self.upstream.idle_count -= 1
            usable = not conn.closed and conn.transport is not None and not conn.transport.is_closing()
            if usable and (keepalive_timeout <= 0 or now - conn.idle_since < keepalive_timeout):
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            # asyncio.timeout, not wait_for: no task of its own, whose frame and the connect
            # error's traceback would hold each other (a cycle per failed connect)
            async with asyncio.timeout(connect_timeout):
                if self.path is None:
                    _, conn = await loop.create_connection(
                        lambda: Connection(self),
                        self.host,
                        self.port,
                        ssl=self.upstream.ssl_context,
                        server_hostname=self.server_hostname,
                    )
                else:
                    _, conn = await loop.create_unix_connection(
                        lambda: Connection(self),
                        self.path,
                        ssl=self.upstream.ssl_context,
                        server_hostname=self.server_hostname,
                    )
        except TimeoutError:
            raise ConnectTimedOut("upstream timed out while connecting") from None
        except OSError as exc:
            raise ConnectFailed(f"connect() failed ({exc.errno}: {exc.strerror or exc})") from None
        return conn

    def release(self, conn: Connection) -> None:
        upstream = self.upstream
        if upstream.closed or upstream.keepalive <= 0:
            conn.close()
            return
        if upstream.idle_count >= upstream.keepalive:
            # nginx's keepalive cache: at most N idle connections; the oldest goes first
            if self.idle:
                self.idle.popleft().close()
                upstream.idle_count -= 1
            else:
                conn.close()
                return
        conn.idle_since = time.monotonic()
        self.idle.append(conn)
        upstream.idle_count += 1

    def forget(self, conn: Connection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
            self.upstream.idle_count -= 1

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


class UpstreamConnections:
    """The keep-alive pools of one upstream group (``keepalive`` idle connections in all), one per
    server (``peers``, in the order of ``servers``: a ``unix:`` socket path has its own pool)."""

    def __init__(
        self,
        servers: Sequence[ServerSpec],
        keepalive: int,
        keepalive_timeout: float,
        scheme: str,
        tls_verify: bool,
        tls_ca: str | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        self.keepalive = keepalive
        self.keepalive_timeout = keepalive_timeout
        self.idle_count = 0
        self.closed = False
        self.ssl_context: ssl.SSLContext | None = None
        self.tls_server_name = tls_server_name  # SNI and the name verified (nginx's proxy_ssl_name)
        if scheme == "https":
            # tls_ca: only that CA bundle is trusted; read within its bound, as the check read it (a
            # file swapped for a FIFO since cannot block the loop, nor a device grow the process)
            cadata = None if tls_ca is None else read_bounded(tls_ca, MAX_PEM_BYTES).decode("ascii", "replace")
            context = ssl.create_default_context(cadata=cadata)
            if not tls_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self.ssl_context = context
        self.peers = tuple(PeerPool(self, s.host, s.port, s.path, self._server_hostname(s)) for s in servers)

    def _server_hostname(self, server: ServerSpec) -> str | None:
        """SNI and the name verified: ``tls_server_name``, else the server's host (``localhost``
        for a ``unix:`` socket, nginx's ``$proxy_host`` for one)."""
        if self.ssl_context is None:
            return None
        return self.tls_server_name or (server.host if server.path is None else "localhost")

    def close(self) -> None:
        self.closed = True
        for pool in self.peers:
            pool.close()
