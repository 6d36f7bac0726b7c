"""Real parts for tests: a threaded upstream on a real socket and the gateway as a subprocess.

Nothing here is mocked: the upstream is an aiohttp app listening on a free
port, and the gateway is started through its real CLI (``python -m gateway
run``) with a YAML file written to a temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

ROOT = Path(__file__).resolve().parent.parent


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before in this test run: the kernel may give a just
    released port again, and a test that asks for two (listen and admin) then got the same
    one twice (its workers could not bind)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_port(
    port: int, host: str = "127.0.0.1", timeout: float = 10.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def pattern(n: int) -> bytes:
    """Deterministic test bytes."""
    block = bytes(range(256)) * 256
    return (block * (n // len(block) + 1))[:n]


class Upstream:
    """An aiohttp upstream in its own thread and event loop, recording what it receives."""

    def __init__(self, name: str = "up", ssl_context: ssl.SSLContext | None = None) -> None:
        self.name = name
        self.ssl_context = ssl_context  # an HTTPS upstream
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
        return f"127.0.0.1:{self.port}"

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
            "peer_port": request.transport.get_extra_info("peername")[1] if request.transport else None,
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


class Gateway:
    """The gateway started through its CLI, with its output in files."""

    def __init__(
        self,
        workdir: Path,
        config_text: str,
        port: int,
        *,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = port
        self.config_path = workdir / "limits.yaml"
        self.config_path.write_text(config_text)
        self.stdout_path = workdir / "gateway.stdout"
        self.stderr_path = workdir / "gateway.stderr"
        self.extra_args = extra_args
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> Gateway:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        if self.env:
            env.update(self.env)
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "run", "-c", str(self.config_path), *self.extra_args],
                stdout=out,
                stderr=err,
                cwd=str(ROOT),
                env=env,
            )
        try:
            wait_port(self.port, timeout=timeout, proc=self.proc)
        except Exception:
            self.stop()
            raise RuntimeError(f"gateway did not start:\n{self.stderr()}") from None
        return self

    def write_config(self, text: str) -> None:
        self.config_path.write_text(text)

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def reload(self, settle: float = 0.5) -> None:
        self.signal(signal.SIGHUP)
        time.sleep(settle)

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def access_lines(self, wait: float = 0.3) -> list[str]:
        time.sleep(wait)  # the access log is flushed every 100 ms
        return [line for line in self.stdout().splitlines() if line.strip()]

    def access_json(self, wait: float = 0.3) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.access_lines(wait)]

    def rss_peak_kb(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise RuntimeError("no VmHWM")


def basic_config(port: int, upstream_addrs: list[str], **sections: str) -> str:
    servers = "\n".join(f"      - {a}" for a in upstream_addrs)
    text = f"""
listen: 127.0.0.1:{port}
shutdown_timeout: 5s
upstreams:
  app:
    servers:
{servers}
    connect_timeout: 1s
    read_timeout: 2s
routes:
  - location: /
    upstream: app
"""
    for value in sections.values():
        text += value
    return text


class NginxProcess:
    """The nginx binary as a child of the test run, with its prefix and error log in ``workdir``."""

    def __init__(self, binary: str, workdir: Path, conf_text: str, port: int) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = port
        self.conf_path = workdir / "nginx.conf"
        self.conf_path.write_text(conf_text)
        self.error_log = workdir / "error.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> NginxProcess:
        cmd = [self.binary, "-p", f"{self.workdir}/", "-c", str(self.conf_path), "-e", str(self.error_log)]
        check = subprocess.run([*cmd, "-t"], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t failed:\n{check.stderr}\n{self.conf_path.read_text()}")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_port(self.port, timeout=10, proc=self.proc)
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"nginx did not start: {exc}\n{self.errors()}") from None
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def errors(self) -> str:
        return self.error_log.read_text(errors="replace") if self.error_log.exists() else ""


class RawUpstream:
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
        self._thread = threading.Thread(target=self._serve, name="raw-upstream", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RawUpstream:
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


def cli(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``gateway ARGS...`` as an operator runs it, from the checkout; its output as text."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        input=stdin,
        env=full_env,
        timeout=timeout,
    )


def temp_fds(gw: Gateway, temp_dir: Path) -> list[str]:
    """The gateway's open files in ``temp_dir`` (anonymous temp files show as '(deleted)'); an fd
    closed between the listing and its readlink is skipped (it is no longer open)."""
    assert gw.proc is not None
    out = []
    fd_dir = Path(f"/proc/{gw.proc.pid}/fd")
    for entry in fd_dir.iterdir():
        try:
            target = os.readlink(entry)
        except FileNotFoundError:
            continue
        if target.startswith(str(temp_dir)):
            out.append(target)
    return out
