"""Upstream doubles on real sockets, each named by what it does.

* ``Upstream``: an aiohttp app in its own thread: echo (JSON), downloads, slow and hanging
  answers, status codes, WebSocket echo, hop-by-hop headers, gzip, cookies; records requests
  (and which connection each came on). On TCP, or on a Unix-domain socket (``unix_path``).
* ``HeadEchoUpstream``: a bare HTTP/1.1 server in a thread that takes any method and answers
  each request with the head it read, as JSON (a subclass scripts other answers).
* ``ScriptUpstream``: an asyncio server in the test's own loop that runs a script (coroutine)
  per connection, for byte-level upstream behaviour.
* ``CountingUpstream``: an asyncio server in its own thread that runs a handler per connection
  and counts accepts, finished responses and when the gateway let go.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
import threading
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSMsgType, web

from tests.support.ports import free_port

__all__ = [
    "CountingUpstream",
    "Handler",
    "HeadEchoUpstream",
    "Script",
    "ScriptUpstream",
    "Upstream",
    "pattern",
    "read_request",
]


def pattern(n: int) -> bytes:
    """Deterministic test bytes."""
    block = bytes(range(256)) * 256
    return (block * (n // len(block) + 1))[:n]


class Upstream:
    """An aiohttp upstream in its own thread and event loop, recording what it receives."""

    def __init__(
        self, name: str = "up", ssl_context: ssl.SSLContext | None = None, unix_path: str | None = None
    ) -> None:
        self.name = name
        self.ssl_context = ssl_context  # an HTTPS upstream
        self.unix_path = unix_path  # listen on this Unix-domain socket instead of a TCP port
        self.port = free_port()
        self.seen: list[dict[str, Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"upstream-{name}", daemon=True)
        self.hooks: dict[str, Callable[[web.Request], Any]] = {}

    # -- lifecycle
    def start(self) -> Upstream:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("upstream did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        fut.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    @property
    def address(self) -> str:
        return f"unix:{self.unix_path}" if self.unix_path else f"127.0.0.1:{self.port}"

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._startup())
        self._ready.set()
        loop.run_forever()
        loop.close()

    async def _startup(self) -> None:
        app = web.Application(client_max_size=1024**4)
        r = app.router
        r.add_route("*", "/echo{tail:.*}", self._echo)
        r.add_get(r"/download/{n:\d+}", self._download)
        r.add_get("/slow", self._slow)
        r.add_get("/hang", self._hang)
        r.add_get("/ws", self._ws)
        r.add_get(r"/status/{code:\d+}", self._status)
        r.add_get("/hop", self._hop)
        r.add_get("/gzip", self._gzip)
        r.add_get("/cookie", self._cookie)
        r.add_route("*", "/{tail:.*}", self._echo)
        self._runner = web.AppRunner(app, access_log=None, auto_decompress=False, shutdown_timeout=0.5)
        await self._runner.setup()
        if self.unix_path:
            await web.UnixSite(self._runner, self.unix_path, ssl_context=self.ssl_context).start()
        else:
            await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.ssl_context).start()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    # -- handlers
    def _record(self, request: web.Request, **extra: Any) -> dict[str, Any]:
        entry = {
            "method": request.method,
            "path": request.raw_path,
            "headers": list(request.headers.items()),
            "peer": request.remote,
            "peer_port": request.transport.get_extra_info("peername")[1]
            if request.transport and not self.unix_path
            else None,
            "connection": id(request.transport),  # the same number: the same connection (keep-alive)
            **extra,
        }
        self.seen.append(entry)
        return entry

    async def _echo(self, request: web.Request) -> web.StreamResponse:
        hook = self.hooks.get("echo")
        if hook is not None:
            await hook(request)
        size = 0
        checksum = 1
        async for chunk in request.content.iter_any():
            size += len(chunk)
            checksum = zlib.adler32(chunk, checksum)
        entry = self._record(request, body_bytes=size, adler32=checksum)
        return web.json_response({**entry, "server": self.name})

    async def _download(self, request: web.Request) -> web.StreamResponse:
        total = int(request.match_info["n"])
        self._record(request)
        response = web.StreamResponse()
        if request.query.get("chunked") != "1":
            response.content_length = total
        await response.prepare(request)
        block = pattern(1 << 20)
        sent = 0
        while sent < total:
            piece = block[: min(len(block), total - sent)]
            await response.write(piece)
            sent += len(piece)
        await response.write_eof()
        return response

    async def _slow(self, request: web.Request) -> web.Response:
        self._record(request)
        await asyncio.sleep(int(request.query.get("ms", "1000")) / 1000)
        return web.Response(text=f"slow {self.name}")

    async def _hang(self, request: web.Request) -> web.Response:
        self._record(request)
        await asyncio.sleep(3600)
        return web.Response(text="never")

    async def _status(self, request: web.Request) -> web.Response:
        self._record(request)
        code = int(request.match_info["code"])
        return web.Response(status=code, text=f"status {code}")

    async def _hop(self, request: web.Request) -> web.Response:
        self._record(request)
        return web.Response(
            text="hop",
            headers={
                "Connection": "keep-alive, X-Up-Private",
                "X-Up-Private": "secret",
                "Keep-Alive": "timeout=5",
                "Proxy-Authenticate": "Basic",
                "Trailer": "X-Checksum",
                "X-Up-Public": "visible",
            },
        )

    async def _gzip(self, request: web.Request) -> web.Response:
        self._record(request)
        raw = b"hello gzip " * 100
        compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
        body = compressor.compress(raw) + compressor.flush()
        return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})

    async def _cookie(self, request: web.Request) -> web.Response:
        self._record(request)
        response = web.Response(text="cookie")
        response.set_cookie("session", "s3cret-" + self.name)
        return response

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        self._record(request)
        ws = web.WebSocketResponse(protocols=("chat.v2", "chat.v1"), autoping=True)
        await ws.prepare(request)
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                if msg.data == "close-me":
                    await ws.close(code=4001, message=b"asked")
                    break
                await ws.send_str("echo:" + msg.data)
            elif msg.type is WSMsgType.BINARY:
                await ws.send_bytes(msg.data[::-1])
        return ws


class HeadEchoUpstream:
    """A bare HTTP/1.1 upstream on a real socket that accepts any method and records request heads.

    It answers every request with 200 and a JSON body naming the method, target and headers it
    read; request bodies (Content-Length only) are read and counted. Unlike aiohttp it does not
    refuse methods it does not know, so it can tell what the gateway really sent.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.heads: list[dict[str, Any]] = []
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", self.port))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="head-echo-upstream", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> HeadEchoUpstream:
        self._sock.settimeout(0.2)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        buffer = b""
        conn.settimeout(10)
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, target, version = lines[0].split(" ", 2)
                headers = [tuple(line.split(": ", 1)) for line in lines[1:]]
                chunked = any(k.lower() == "transfer-encoding" and "chunked" in v.lower() for k, v in headers)
                length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
                body = b""
                if chunked:
                    while True:
                        while b"\r\n" not in buffer:
                            data = conn.recv(65536)
                            if not data:
                                return
                            buffer += data
                        size_line, buffer = buffer.split(b"\r\n", 1)
                        size = int(size_line.split(b";")[0], 16)
                        while len(buffer) < size + 2:
                            data = conn.recv(65536)
                            if not data:
                                return
                            buffer += data
                        body += buffer[:size]
                        buffer = buffer[size + 2 :]
                        if size == 0:
                            break
                else:
                    while len(buffer) < length:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buffer += data
                    body, buffer = buffer[:length], buffer[length:]
                entry = {
                    "method": method,
                    "target": target,
                    "version": version,
                    "headers": headers,
                    "body": len(body),
                    "body_bytes": body.decode("latin-1"),
                }
                self.heads.append(entry)
                if not self.respond(conn, entry):
                    return

    def respond(self, conn: socket.socket, entry: dict[str, Any]) -> bool:
        """Answer one request (``entry`` as recorded in ``heads``); False closes the connection.
        Here: 200 with the entry as JSON; a subclass scripts other answers."""
        body = json.dumps(entry).encode()
        head_bytes = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        conn.sendall(head_bytes if entry["method"] == "HEAD" else head_bytes + body)
        return True


Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """The head of the next request on this connection, up to and including the blank line."""
    return await reader.readuntil(b"\r\n\r\n")


class ScriptUpstream:
    """Runs ``script`` for every connection, in the test's event loop; counts connections."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.port = free_port()
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> ScriptUpstream:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.script(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


Handler = Callable[["CountingUpstream", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class CountingUpstream:
    """An HTTP/1.1 upstream on a real socket, in its own thread, that counts what it accepts."""

    def __init__(self, handler: Handler) -> None:
        self.port = free_port()
        self.handler = handler
        self.accepted = 0
        self.finished_at: list[float] = []  # when a response was written whole
        self.eof_at: list[float] = []  # when the gateway then closed the connection
        self.bodies: list[bytes] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._server: asyncio.Server

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> CountingUpstream:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, backlog=1024)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _shutdown(self) -> None:
        self._server.close()
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the gateway went away, or the test is over
        finally:
            writer.close()

    @staticmethod
    async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        match = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        body = await reader.readexactly(int(match.group(1))) if match else b""
        return head, body
