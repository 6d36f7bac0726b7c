"""One-line HTTP for tests: ``await get(url)`` / ``await request(method, url)`` -> ``Reply``.

Every call goes over a real socket with aiohttp. Without ``session=`` it opens a session of
its own for that one request (a new connection each time; with several workers the kernel
spreads them); with ``session=`` it reuses the caller's connections.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any, NamedTuple

import aiohttp
from multidict import CIMultiDict

__all__ = ["Reply", "get", "request", "status"]


class Reply(NamedTuple):
    """A whole response: ``status, headers, body, seconds = await get(url)`` also works."""

    status: int
    headers: CIMultiDict[str]  # case-insensitive; ``getall`` gives every value of a repeated field
    body: bytes
    seconds: float  # from sending the request to the end of the body

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


async def request(
    method: str,
    url: str,
    *,
    session: aiohttp.ClientSession | None = None,
    timeout: float = 30.0,
    auto_decompress: bool = True,
    **kwargs: Any,
) -> Reply:
    """``method url`` with aiohttp's keyword arguments (``headers=``, ``data=``, ``json=``,
    ``allow_redirects=`` ...); the whole body is read before it returns. ``auto_decompress=False``
    keeps a gzip body as it came (for a session of its own)."""
    if session is None:
        connector = aiohttp.TCPConnector(force_close=True)
        limit = aiohttp.ClientTimeout(total=timeout)
        async with aiohttp.ClientSession(connector=connector, timeout=limit, auto_decompress=auto_decompress) as own:
            return await request(method, url, session=own, **kwargs)
    started = time.monotonic()
    async with session.request(method, url, **kwargs) as resp:
        body = await resp.read()
        return Reply(resp.status, resp.headers.copy(), body, time.monotonic() - started)


async def get(url: str, **kwargs: Any) -> Reply:
    """``GET url``; see ``request``."""
    return await request("GET", url, **kwargs)


async def status(url: str, **kwargs: Any) -> int:
    """Only the status of ``GET url``."""
    return (await request("GET", url, **kwargs)).status


def exchange(port: int, data: bytes | list[bytes], timeout: float = 5.0, pause: float = 0.05) -> bytes:
    """Send raw ``data`` to 127.0.0.1:``port`` and read until the server closes (or ``timeout``).

    A list is sent as separate packets, ``pause`` seconds apart (Nagle off)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(timeout)
        if isinstance(data, bytes):
            sock.sendall(data)
        else:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for piece in data:
                sock.sendall(piece)
                time.sleep(pause)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out
