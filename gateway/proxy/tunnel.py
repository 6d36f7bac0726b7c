"""After a 101: the client's connection and the upstream's joined byte for byte, as nginx does.

No frame is parsed and nothing is held back: what one side sends is written to
the other at once. Backpressure both ways: when the client stops reading, the
upstream is no longer read (and the other way round), so a side that does not
read makes the other wait, never the gateway buffer.

* The client side is aiohttp's connection. After the 101 is written, its
  RequestHandler hands us what the client sends (``set_parser``: it calls
  ``feed_data`` and, when the client goes, ``feed_eof``), including the bytes it
  had buffered after the handshake; we write to its transport.
* The upstream side is this object as the protocol of the upstream's transport
  (``Connection.detach``), starting with the bytes that came with the 101.
* The tunnel ends when either side closes (what the other side still has to
  receive is flushed first) or when no byte has moved either way for
  ``idle_timeout`` (nginx applies ``proxy_read_timeout`` to upgraded connections).
"""

from __future__ import annotations

import asyncio
import enum

from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_protocol import RequestHandler

from gateway.proxy.http1 import Connection


class End(enum.Enum):
    UPSTREAM_CLOSED = "upstream closed the connection"
    CLIENT_CLOSED = "client closed the connection"
    IDLE = "timed out"


class Tunnel(asyncio.Protocol):
    def __init__(self, client: RequestHandler, writer: AbstractStreamWriter, idle_timeout: float) -> None:
        transport = client.transport
        if transport is None:
            raise ConnectionResetError("client closed the connection")
        self.loop = asyncio.get_running_loop()
        self.client = client
        self.client_transport = transport
        self.writer = writer
        self.upstream: asyncio.Transport | None = None
        self.idle_timeout = idle_timeout
        self.sent_to_client = 0
        self.sent_to_upstream = 0
        self.ended: asyncio.Future[End] = self.loop.create_future()
        self._active = self.loop.time()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._drain: asyncio.Task[None] | None = None

    async def run(self, conn: Connection) -> End:
        """Join the client's connection to ``conn`` (which got the 101) until the tunnel ends."""
        self.upstream, tail = conn.detach(self)
        self._idle_timer = self.loop.call_later(self.idle_timeout, self._check_idle)
        # aiohttp buffered what the client sent after its handshake: it comes through feed_data now.
        # The parser type is aiohttp's WebSocketReader; it only ever calls feed_data() and feed_eof().
        self.client.set_parser(self)  # type: ignore[arg-type]
        self.client.keep_alive(False)
        if tail:
            self._to_client(tail)
        if self.upstream is None:
            self._end(End.UPSTREAM_CLOSED)
        else:
            self.upstream.resume_reading()  # paused since the 101 arrived
        try:
            end = await self.ended
            if end is End.UPSTREAM_CLOSED:
                await self._flush_client()
            return end
        finally:
            self._close()

    # -- the client's side (aiohttp's RequestHandler calls these) --------------------------------------
    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        upstream = self.upstream
        if upstream is not None and not self.ended.done() and not upstream.is_closing():
            upstream.write(data)
            self.sent_to_upstream += len(data)
            self._active = self.loop.time()
        return False, b""

    def feed_eof(self) -> None:
        self._end(End.CLIENT_CLOSED)

    # -- the upstream's side (asyncio.Protocol) ---------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self._to_client(data)

    def eof_received(self) -> bool | None:
        self._end(End.UPSTREAM_CLOSED)
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(End.UPSTREAM_CLOSED)

    def pause_writing(self) -> None:
        if not self.client_transport.is_closing():
            self.client_transport.pause_reading()  # the upstream is not reading: stop reading the client

    def resume_writing(self) -> None:
        if not self.client_transport.is_closing():
            self.client_transport.resume_reading()

    # -- internals ------------------------------------------------------------------------------------------
    def _to_client(self, data: bytes) -> None:
        if self.ended.done() or self.client_transport.is_closing():
            return
        self.client_transport.write(data)
        self.sent_to_client += len(data)
        self._active = self.loop.time()
        upstream = self.upstream
        if self.client.writing_paused and self._drain is None and upstream is not None and not upstream.is_closing():
            upstream.pause_reading()  # the client is not reading: stop reading the upstream
            self._drain = self.loop.create_task(self._resume_upstream_when_drained())

    async def _resume_upstream_when_drained(self) -> None:
        try:
            await self.writer.drain()
        except ConnectionError:
            self._end(End.CLIENT_CLOSED)
            return
        finally:
            self._drain = None
        upstream = self.upstream
        if upstream is not None and not self.ended.done() and not upstream.is_closing():
            upstream.resume_reading()

    def _check_idle(self) -> None:
        idle = self.loop.time() - self._active
        if idle >= self.idle_timeout:
            self._end(End.IDLE)
        else:
            self._idle_timer = self.loop.call_later(self.idle_timeout - idle, self._check_idle)

    def _end(self, end: End) -> None:
        if not self.ended.done():
            self.ended.set_result(end)

    async def _flush_client(self) -> None:
        """What the upstream sent before it closed reaches the client, unless the client stalls."""
        if not self.client.writing_paused:
            return
        try:
            async with asyncio.timeout(self.idle_timeout):
                await self.writer.drain()
        except TimeoutError:
            self.client_transport.abort()
        except ConnectionError:
            pass

    def _close(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._drain is not None:
            self._drain.cancel()
        upstream = self.upstream
        if upstream is not None and not upstream.is_closing():
            # close() sends what is buffered first; an upstream that does not take it is cut off.
            upstream.close()
            if upstream.get_write_buffer_size():
                self.loop.call_later(self.idle_timeout, upstream.abort)
        idle = self.ended.done() and not self.ended.cancelled() and self.ended.result() is End.IDLE
        if idle and self.client_transport.get_write_buffer_size():
            self.client_transport.abort()  # a client that stopped reading gets no more time
