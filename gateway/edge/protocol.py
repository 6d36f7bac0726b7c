"""The client side of the gateway: aiohttp's HTTP/1 server protocol, hardened.

``EdgeProtocol`` is aiohttp's ``RequestHandler`` (its C parser, its request and
response machinery) with what a server facing hostile clients needs:

* **caps at accept** (``ConnectionLimiter``): over ``max_connections_per_ip`` or with no
  room left under the connection budget (``worker_connections``, or what the open file limit
  allows), the connection is reset before a byte is read; at the budget, connections making
  no progress (idle, mid-header, mid-handshake, or a body below ``client_body_min_rate``)
  make room;
* **timeouts**: the whole header must arrive within ``client_header_timeout`` of the
  connection's start; once a connection is idle, ``keepalive_timeout`` is its whole
  budget, the next request's header included; a write to a client that does not read
  for ``send_timeout`` closes the connection;
* **request lines** llhttp would mishandle (``requestline``): custom token methods are
  proxied as nginx does, HTTP/0.9 gets 400, versions other than 1.0 and 1.1 get 505;
* **error answers** that never echo request bytes: 414 for a request line over
  ``large_client_header_buffers``, 431 for a header over it, 400 otherwise, always
  ``HTTP/1.1`` and ``Connection: close``.

This subclasses aiohttp internals on purpose (the issue is the server they make);
pyproject.toml pins aiohttp's minor version, and the tests exercise every override.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web
from aiohttp.http import HttpVersion10, HttpVersion11
from aiohttp.http_exceptions import BadStatusLine, HttpProcessingError, LineTooLong
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import MAX_MSG_QUEUE_SIZE, RequestHandler, _ErrInfo

from gateway.edge import requestline
from gateway.edge.connections import ConnectionCaps, ConnectionLimiter, reset
from gateway.http import responses
from gateway.http.realip import UNKNOWN, parse_addr
from gateway.logs import error as errorlog
from gateway.logs.escape import escape

if TYPE_CHECKING:
    from aiohttp.web_request import BaseRequest
    from aiohttp.web_response import StreamResponse

    from gateway.edge.proxyproto import ProxyHeader
    from gateway.edge.settings import Budget


@dataclass(frozen=True, slots=True)
class EdgeSettings:
    """The client-side limits of the running configuration (swapped whole on reload)."""

    caps: ConnectionCaps
    client_header_timeout_s: float
    keepalive_timeout_s: float  # 0: no keep-alive
    send_timeout_s: float
    header_buffer_size: int  # large_client_header_buffers: one buffer (request line, one header)
    header_buffers: int  # ... and how many of them a whole header may fill
    budget: Budget | None = None  # how caps.worker_connections was chosen (the start-up log's line)


class EdgeServer(web.Server):
    """aiohttp's low-level server, making ``EdgeProtocol`` connections."""

    def __init__(self, handler: Any, settings: EdgeSettings, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.settings = settings
        self.limiter = ConnectionLimiter(settings.caps)
        _announce(settings.budget)

    def configure(self, settings: EdgeSettings) -> None:
        old = self.settings.budget
        self.settings = settings
        self.limiter.configure(settings.caps)
        if settings.budget != old:
            _announce(settings.budget)

    def __call__(self) -> EdgeProtocol:
        settings = self.settings
        return EdgeProtocol(
            self,
            loop=self._loop,
            keepalive_timeout=settings.keepalive_timeout_s,
            max_line_size=settings.header_buffer_size,
            max_field_size=settings.header_buffer_size,
            # nginx counts no headers, only their bytes (the buffers, checked in _adjust); the
            # parser's own count only bounds what one connection holds before that check.
            max_headers=max(128, settings.header_buffer_size * settings.header_buffers // 64),
            **self._kwargs,
        )


def _announce(budget: Budget | None) -> None:
    """The start-up (or reload) line saying how many client connections this worker serves, and why."""
    if budget is None:
        return
    if budget.fd_bound:
        errorlog.log.warning("%s", budget.message)
    else:
        errorlog.log.log(errorlog.NOTICE, "%s", budget.message)


class EdgeProtocol(RequestHandler):
    __slots__ = (
        "_body",
        "_body_since",
        "_edge",
        "_fed",
        "_framer",
        "_held",
        "_ip_key",
        "_refused",
        "_renames",
        "_settings",
        "_start_deadline",
        "proxy",
        "tls",
    )

    def __init__(self, manager: EdgeServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._edge = manager
        self._settings = manager.settings
        self._ip_key: bytes | None = None
        self._start_deadline = 0.0  # when the first header is due, if the connection began earlier
        self.proxy: ProxyHeader | None = None  # the PROXY protocol header of the connection, if any
        self.tls: Any = None  # the connection's ssl.SSLObject on a TLS listener ($scheme https)
        self._refused = False
        self._framer = requestline.Framer()  # where the requests start in the bytes that arrive
        self._held = b""  # the start of a request line, kept until its method is whole
        self._fed = 0  # bytes parsed since the packet that completed the last request
        # The real methods of the next parsed requests, in order (None: not renamed).
        self._renames: collections.deque[str | None] = collections.deque()
        self._body: StreamReader | None = None  # the request body still arriving, while it is
        self._body_since = 0.0  # ... and when its request began (time.monotonic)

    # -- accept, close, reuse ---------------------------------------------------------------------
    def adopt(self, key: bytes, *, proxy: ProxyHeader | None = None, deadline: float = 0.0) -> None:
        """Carry on a connection the limiter counted at accept (TLS, after its handshake; one that
        began with a PROXY protocol header, then ``proxy`` and when its first header is due):
        ``connection_made`` then admits nothing more."""
        self._ip_key = key
        self.proxy = proxy
        self._start_deadline = deadline

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._ip_key is None:
            peername = transport.get_extra_info("peername")
            peer = parse_addr(peername[0]) if isinstance(peername, tuple) and peername else None
            key = self._edge.limiter.admit(self, peer or UNKNOWN)
            if key is None:
                self._refused = True
                reset(cast(asyncio.Transport, transport))
                return
            self._ip_key = key
        self.tls = transport.get_extra_info("ssl_object")
        super().connection_made(transport)
        # aiohttp arms its keep-alive timer at connect; the first header gets its own budget.
        if self._keepalive_handle is not None:
            self._keepalive_handle.cancel()
        close_time = self._start_deadline or self._loop.time() + self._settings.client_header_timeout_s
        self._next_keepalive_close_time = close_time
        self._keepalive_handle = self._loop.call_at(close_time, self._process_keepalive)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return
        self._forget()
        super().connection_lost(exc)

    def _forget(self) -> None:
        key = self._ip_key
        if key is not None:
            self._ip_key = None
            self._edge.limiter.release(self, key)

    def evict(self) -> None:
        """Closed to make room for a new connection (it was idle, still sending its header, or
        sending its body below ``client_body_min_rate``)."""
        self._forget()
        if self.transport is not None:
            reset(self.transport)
            self.transport = None
        self.force_close()

    def body_progress(self) -> tuple[float, int, bool] | None:
        """For the limiter, only when it is out of room: how far the request body has come."""
        body = self._body
        if body is None or body.is_eof():
            return None
        return self._body_since, body.total_bytes, self._reading_paused

    async def _handle_request(
        self, request: BaseRequest, start_time: float | None, request_handler: Any
    ) -> tuple[StreamResponse, bool]:
        limiter = self._edge.limiter
        receiving = False
        if self._ip_key is not None:
            if request.body_exists and not (body := request.content).is_eof():
                self._body, self._body_since = body, time.monotonic()
                limiter.receiving_body(self)
                receiving = True
            else:
                limiter.busy(self)
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            if receiving:
                self._body = None
                limiter.body_done(self)
            if self._ip_key is not None and self.transport is not None and not self._force_close:
                limiter.idle(self)

    # -- a client that stops reading ------------------------------------------------------------------
    async def _drain_helper(self) -> None:
        if self.transport is None or not self._paused:
            await super()._drain_helper()
            return
        waiter = self._drain_waiter
        if waiter is None:
            waiter = self._drain_waiter = self._loop.create_future()
        timeout = self._settings.send_timeout_s
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            peer = self.peername
            client = peer[0] if isinstance(peer, tuple) else "-"
            errorlog.log.info("client timed out (%ss) while sending to client, client: %s", f"{timeout:g}", client)
            self.force_close()
            raise ConnectionResetError("send_timeout") from None

    # -- parsing ------------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close:
            return
        if self._payload_parser is not None or self._upgraded:
            super().data_received(data)  # a WebSocket, or the bytes after an upgrade request
            return
        if self._held:
            data, self._held = self._held + data, b""
        framer = self._framer
        while True:
            if not data or (framer.state == requestline.BOUNDARY and requestline.single_known_request(data)):
                if not data:
                    self._feed(data)  # the parser goes on with what it kept (a queue that drained)
                    return
                if self._renames:  # keep the queue in step with the requests (None: not renamed)
                    self._renames.append(None)
                messages = self._feed(data)
                # One message, without a body or a switch: this packet's request, and the next
                # byte starts one (a parser holding older bytes would have given more than one).
                # Otherwise the framer reads the header's framing itself.
                if messages is not None and not (
                    len(messages) == 1
                    and messages[0][1] is EMPTY_PAYLOAD
                    and not getattr(messages[0][0], "upgrade", True)
                ):
                    framer.single(data)
                return
            scan = framer.scan(data)
            if scan.http09:
                self._queue_error(400, "HTTP/0.9 request")
                return
            self._renames.extend(scan.methods)
            parts = scan.parts
            for index, part in enumerate(parts):
                if self._upgraded:  # a switch the framer did not see coming: the bytes wait, as they came
                    scan.rest = b"".join(parts[index:]) + scan.held + scan.rest
                    scan.held = b""
                    break
                if self._force_close or self._feed(part) is None:
                    framer.lost()
                    return
            self._held = scan.held
            data = scan.rest
            if not data:
                return
            if self._upgraded:  # the switch is the handler's to accept: until then the bytes wait
                self._message_tail += data
                return
            # the parser declined the switch (it takes only WebSocket) and goes on: so do we

    def _feed(self, data: bytes) -> Sequence[Any] | None:
        """Parse ``data`` and queue the requests it completes (returned); None after a parse error."""
        fed = self._fed + len(data)
        assert self._parser is not None
        ok = True
        try:
            messages, upgraded, tail = self._parser.feed_data(data)
        except HttpProcessingError as exc:
            messages = [(_ErrInfo(status=400, exc=exc, message=exc.message), EMPTY_PAYLOAD)]
            upgraded = False
            tail = b""
            ok = False
            self._framer.lost()
        if messages:
            if self._keepalive_handle is not None:
                # A whole header arrived: its timer is done. aiohttp arms keepalive_timeout
                # when the response is sent, and that is the idle connection's whole budget.
                self._keepalive_handle.cancel()
                self._keepalive_handle = None
            messages = self._adjust(messages, fed)
            # Counted from this packet on (more than what is left of it: a bound, not a measure).
            self._fed = len(data)
            framer = self._framer
            # Found again: the parser is between requests if the last one has no body and the
            # packet ends with its header, and the message queue did not make it pause (keeping a tail).
            if (
                framer.state == requestline.UNKNOWN
                and messages[-1][1] is EMPTY_PAYLOAD
                and data.endswith(b"\r\n\r\n")
                and len(self._messages) + len(messages) < MAX_MSG_QUEUE_SIZE - 1
            ):
                framer.state = requestline.BOUNDARY
        else:
            self._fed = fed
        for item in messages:
            self._request_count += 1
            self._messages.append(item)
        waiter = self._waiter
        if messages and waiter is not None and not waiter.done():
            waiter.set_result(None)
        if not self._buffer_paused and len(self._messages) >= self._max_msg_queue_size:
            self._pause_reading_for_buffer()
        self._upgraded = upgraded
        if upgraded and tail:
            self._message_tail = tail
        return messages if ok else None

    def finish_response(  # not a coroutine of its own: the base's is returned, one frame less per request
        self, request: BaseRequest, resp: StreamResponse, start_time: float | None
    ) -> Coroutine[Any, Any, tuple[StreamResponse, bool]]:
        # An upgrade the handler declined: the requests queued behind it are parsed here, as
        # aiohttp would, but through data_received, so their custom methods are renamed too.
        if self._upgraded and not self._messages and self._payload_parser is None and self._parser is not None:
            self._parser.set_upgraded(False)
            self._upgraded = False
            tail, self._message_tail = self._message_tail, b""
            self._framer.state = requestline.BOUNDARY  # the upgrade request was whole: one starts here
            if tail:
                self.data_received(tail)
                if self._buffer_paused and len(self._messages) < self._max_msg_queue_size:
                    self._resume_reading_if_drained()
        return RequestHandler.finish_response(self, request, resp, start_time)

    def _adjust(self, messages: Any, fed: int) -> list[Any]:
        """Put back a renamed method; apply keep-alive and the whole-header size limit
        (measured only when ``fed``, the bytes these headers came in, could exceed it)."""
        settings = self._settings
        renames = self._renames
        header_limit = settings.header_buffer_size * settings.header_buffers
        close_all = not settings.keepalive_timeout_s
        if not renames and not close_all and fed <= header_limit:
            return messages if isinstance(messages, list) else list(messages)  # the usual case
        out = []
        for message, payload in messages:
            if isinstance(message, _ErrInfo):
                out.append((message, payload))
                continue
            rename = renames.popleft() if renames else None
            if rename is not None:
                message = message._replace(method=rename)
            if fed > header_limit:
                size = len(message.path) + sum(len(name) + len(value) + 4 for name, value in message.raw_headers)
                if size > header_limit:
                    error = HttpProcessingError(code=431, message="request header too large")
                    out.append((_ErrInfo(status=431, exc=error, message=error.message), payload))
                    continue
            if close_all and not message.should_close:
                message = message._replace(should_close=True)
            out.append((message, payload))
        return out

    def _queue_error(self, status: int, reason: str) -> None:
        error = HttpProcessingError(code=status, message=reason)
        self._messages.append((_ErrInfo(status=status, exc=error, message=reason), EMPTY_PAYLOAD))
        self._request_count += 1
        self._framer.lost()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- answers to what could not be parsed --------------------------------------------------------------
    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        status = _status_for(exc, status)
        peer = self.peername
        client = peer[0] if isinstance(peer, tuple) else "-"
        if isinstance(exc, ConnectionError):
            errorlog.log.info("client closed the connection while the response was sent, client: %s", client)
        elif status >= 500 and status != 505:
            errorlog.log.error("unexpected error while handling a request, client: %s", client, exc_info=exc)
        else:
            detail = _describe(exc, message)
            errorlog.log.info("client sent invalid request (%s), client: %s", detail, client)
        if request.writer.output_size > 0:
            raise ConnectionError("a response is on its way already: the connection can only be closed")
        # The stand-in request of an unparsable message says HTTP/1.0; we answer HTTP/1.1 as nginx does.
        request._version = HttpVersion11
        request._cache.pop("version", None)
        response = responses.error(status, "")
        response.force_close()
        return response


def _status_for(exc: BaseException | None, status: int) -> int:
    if isinstance(exc, LineTooLong):
        # aiohttp's C parser collects the request target in a bytearray, header lines in bytes.
        return 414 if isinstance(exc.args[0], bytearray) else 431
    if isinstance(exc, HttpProcessingError) and exc.code in (414, 431, 505):
        return exc.code
    if isinstance(exc, BadStatusLine) and "Invalid HTTP version" in str(exc):
        return 505
    if isinstance(exc, HttpProcessingError) and "`Transfer-Encoding`" in (exc.message or ""):
        return 501  # a coding other than chunked (llhttp refuses it): nginx's "unknown Transfer-Encoding"
    return status


def _describe(exc: BaseException | None, message: str | None) -> str:
    """A short, escaped description for the error log (never the raw request bytes)."""
    if isinstance(exc, LineTooLong):
        return f"line longer than {exc.args[1]} bytes"
    text = (message or (type(exc).__name__ if exc is not None else "bad request")).splitlines()
    first = text[0].strip() if text else "bad request"
    return escape(first[:80])


def unsupported_version(request: BaseRequest) -> int:
    """0 for HTTP/1.0 and 1.1; otherwise the status to answer (400 for 0.9, 505 for 2.0 and up).

    The parser paths that bypass ``data_received`` (the bytes queued behind a declined
    upgrade) meet this check in the pipeline."""
    version = request.version
    if version in (HttpVersion11, HttpVersion10):
        return 0
    request._version = HttpVersion11
    request._cache.pop("version", None)
    return 400 if version < HttpVersion10 else 505
