"""One-line HTTP for tests: ``await get(url)`` / ``await request(method, url)`` -> ``Reply``.

Every call goes over a real socket with aiohttp. Without ``session=`` it opens a session of
its own for that one request (a new connection each time; with several workers the kernel
spreads them); with ``session=`` it reuses the caller's connections.
"""

from __future__ import annotations

import json
import time
from typing import Any, NamedTuple

import aiohttp

__all__ = ["Reply", "get", "request", "status"]


class Reply(NamedTuple):
    """A whole response: ``status, headers, body, seconds = await get(url)`` also works."""

    status: int
    headers: dict[str, str]  # of a repeated field, one value: ask aiohttp directly for all of them
    body: bytes
    seconds: float  # from sending the request to the end of the body

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


async def request(
    method: str, url: str, *, session: aiohttp.ClientSession | None = None, timeout: float = 30.0, **kwargs: Any
) -> Reply:
    """``method url`` with aiohttp's keyword arguments (``headers=``, ``data=``, ``json=``,
    ``allow_redirects=`` ...); the whole body is read before it returns."""
    if session is None:
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as own:
            return await request(method, url, session=own, **kwargs)
    started = time.monotonic()
    async with session.request(method, url, **kwargs) as resp:
        body = await resp.read()
        return Reply(resp.status, dict(resp.headers), body, time.monotonic() - started)


async def get(url: str, **kwargs: Any) -> Reply:
    """``GET url``; see ``request``."""
    return await request("GET", url, **kwargs)


async def status(url: str, **kwargs: Any) -> int:
    """Only the status of ``GET url``."""
    return (await request("GET", url, **kwargs)).status
