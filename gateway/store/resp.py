"""A pipelined Redis connection for the request path (standalone Redis).

Redis answers a connection's commands in order, so one connection can carry every
request in flight: each command appends a future to a FIFO and the reply to the
oldest command resolves it. Concurrent requests share one socket and their
writes coalesce, with no pool, no lock and no per-call task. redis-py still does
everything else (ban list, pub/sub, cluster, sentinel); this only sends EVALSHA,
SCRIPT LOAD and ZREM on the hot path.

Replies are parsed by hiredis when it is installed (the ``speedups`` extra), else
by a small parser for the reply types these commands produce.

A command that does not get its reply within the timeout closes the connection
(failing everything queued on it): a Redis that stopped answering must not hold
requests, and the next command reconnects.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis comes with the speedups extra
    hiredis = None  # type: ignore[assignment]


class RespError(Exception):
    """An error reply (``-ERR ...``); ``NOSCRIPT`` ones are ``NoScript``."""


class NoScript(RespError):
    pass


class RespConnectionError(ConnectionError):
    def __init__(self, message: str, *, collateral: bool = False) -> None:
        super().__init__(message)
        # True for commands that failed only because another one broke their shared
        # connection: the breaker counts the cause once, not every queued request.
        self.collateral = collateral


def encode_args(args: Sequence[Any]) -> bytes:
    """Bulk strings for ``args``, without the array header (see ``encode``)."""
    out = []
    for arg in args:
        kind = type(arg)
        if kind is bytes:
            data = arg
        elif kind is int:
            data = b"%d" % arg
        elif kind is str:
            data = arg.encode()
        else:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def encode_keys(keys: Sequence[bytes]) -> bytes:
    """Bulk strings for ``keys``, all bytes (``encode_args`` without its type dispatch)."""
    return b"".join([b"$%d\r\n%s\r\n" % (len(key), key) for key in keys])


def encode(args: tuple[Any, ...], tail: bytes = b"", tail_count: int = 0) -> bytes:
    """A command: ``args``, then ``tail_count`` arguments already encoded in ``tail``."""
    return b"*%d\r\n" % (len(args) + tail_count) + encode_args(args) + tail


class _PyReader:
    """Enough RESP2 for our replies: integers, simple and bulk strings, errors, arrays."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self.buffer += data

    def gets(self) -> Any:
        reply, end = self._parse(0)
        if end < 0:
            return False
        del self.buffer[:end]
        return reply

    def _parse(self, pos: int) -> tuple[Any, int]:
        buf = self.buffer
        line_end = buf.find(b"\r\n", pos)
        if line_end < 0:
            return None, -1
        kind, line = buf[pos : pos + 1], bytes(buf[pos + 1 : line_end])
        pos = line_end + 2
        if kind == b":":
            return int(line), pos
        if kind == b"+":
            return line, pos
        if kind == b"-":
            return _error(line.decode(errors="replace")), pos
        if kind == b"$":
            size = int(line)
            if size < 0:
                return None, pos
            if len(buf) < pos + size + 2:
                return None, -1
            return bytes(buf[pos : pos + size]), pos + size + 2
        if kind == b"*":
            count = int(line)
            if count < 0:
                return None, pos
            items = []
            for _ in range(count):
                item, pos = self._parse(pos)
                if pos < 0:
                    return None, -1
                items.append(item)
            return items, pos
        raise RespConnectionError(f"unexpected reply type {kind!r}")


def _error(message: str) -> RespError:
    return NoScript(message) if message.startswith("NOSCRIPT") else RespError(message)


class RespConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.reader: Any = hiredis.Reader() if hiredis is not None else _PyReader()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            try:
                reply = self.reader.gets()
            except Exception as exc:  # a protocol error: nothing on this connection can be trusted
                self.fail(RespConnectionError(f"bad reply from Redis: {exc}"))
                return
            if reply is False:
                return
            if not self.waiters:
                self.fail(RespConnectionError("a reply nobody asked for"))
                return
            waiter = self.waiters.popleft()
            if waiter.done():
                continue  # its caller gave up (the connection is being closed anyway)
            if hiredis is not None and isinstance(reply, hiredis.ReplyError):
                waiter.set_exception(_error(str(reply)))
            elif isinstance(reply, RespError):
                waiter.set_exception(reply)
            else:
                waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RespConnectionError(f"connection to Redis lost ({exc})" if exc else "Redis closed the connection"))

    def fail(self, error: Exception) -> None:
        self.closed = True
        first = True
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error if first else RespConnectionError(str(error), collateral=True))
                first = False
        if self.transport is not None:
            self.transport.close()

    def send(self, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        return self.send_encoded(encode(args))

    def send_encoded(self, data: bytes) -> asyncio.Future[Any]:
        if self.closed or self.transport is None:
            raise RespConnectionError("not connected to Redis")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        self.transport.write(data)
        return future


class RespClient:
    """One pipelined connection to a standalone Redis, opened (again) on demand."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        self.scheme = parts.scheme
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 6379
        self.path = unquote(parts.path) if parts.scheme == "unix" else ""
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        query = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
        db_text = query.get("db") or (parts.path.strip("/") if parts.scheme != "unix" else "")
        self.db = int(db_text) if db_text.isdigit() else 0
        self.timeout = timeout
        self.connection: RespConnection | None = None
        self._connecting: asyncio.Future[RespConnection] | None = None

    async def _connect(self) -> RespConnection:
        loop = asyncio.get_running_loop()
        if self.scheme == "unix":
            _, conn = await loop.create_unix_connection(RespConnection, self.path)
        else:
            context = ssl.create_default_context() if self.scheme == "rediss" else None
            _, conn = await loop.create_connection(RespConnection, self.host, self.port, ssl=context)
        try:
            setup = []
            if self.password is not None:
                auth = ("AUTH", self.username, self.password) if self.username else ("AUTH", self.password)
                setup.append(conn.send(auth))
            if self.db:
                setup.append(conn.send(("SELECT", self.db)))
            for future in setup:
                await future
        except BaseException:
            conn.fail(RespConnectionError("connection setup failed"))  # and close the socket
            raise
        return conn

    async def connection_(self) -> RespConnection:
        conn = self.connection
        if conn is not None and not conn.closed:
            return conn
        if self._connecting is None:
            # Bounded: a connect that hangs must not hold every later call behind it.
            self._connecting = asyncio.ensure_future(asyncio.wait_for(self._connect(), self.timeout))
        try:
            conn = await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None
        self.connection = conn
        return conn

    async def call(self, *args: Any) -> Any:
        """One command; at most ``timeout`` long, connect included."""
        try:
            async with asyncio.timeout(self.timeout):
                conn = await self.connection_()
                return await conn.send(args)
        except TimeoutError:
            if self.connection is not None:
                self.connection.fail(RespConnectionError("Redis did not answer in time"))
            raise

    async def call_encoded(self, data: bytes) -> Any:
        """Send an encoded command; the caller bounds the wait and calls ``abort`` on timeout."""
        conn = await self.connection_()
        return await conn.send_encoded(data)

    def abort(self, reason: str) -> None:
        """A command did not get its reply in time: drop the connection (and what waits on it)."""
        if self.connection is not None:
            self.connection.fail(RespConnectionError(reason))

    def close(self) -> None:
        if self.connection is not None:
            self.connection.fail(RespConnectionError("closed"))
            self.connection = None
