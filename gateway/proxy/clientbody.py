"""The client's request body as the proxy reads it: a byte limit, timeouts, ``100-continue``.

``RequestBody`` is an async iterator over the body's chunks that counts the bytes and
knows whether it was touched. A streamed body that was (partly) read cannot be sent
again; whether a retry may replay it is ``gateway/proxy/nextupstream.py``'s question.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from aiohttp import web


class BodyTooLarge(Exception):
    """More than ``client_max_body_size`` arrived."""


class ClientBodyError(Exception):
    """The client's body could not be read: it closed early, or sent a malformed chunked body."""


class ClientBodyTimeout(ClientBodyError):
    """The client was too slow: ``client_body_timeout`` between reads, or the whole-body deadline."""


class RequestBody:
    """The client's body as an async iterator that counts bytes and knows if it was touched.

    ``timeout`` bounds the wait between two reads (nginx's ``client_body_timeout``),
    ``deadline`` the whole body from its first read (0: none)."""

    def __init__(self, request: web.BaseRequest, limit: int, timeout: float, deadline: float = 0.0) -> None:
        self.request = request
        self.limit = limit
        self.timeout = timeout
        self.deadline = deadline
        self.started = False
        self.received = 0

    async def _chunks(self) -> AsyncIterator[bytes]:
        self.started = True
        limit = self.limit
        content = self.request.content
        ends = time.monotonic() + self.deadline if self.deadline > 0 else None
        try:
            if self.request.headers.get("Expect", "").lower() == "100-continue":
                version = self.request.version
                await self.request.writer.write(f"HTTP/{version.major}.{version.minor} 100 Continue\r\n\r\n".encode())
            while True:
                wait = self.timeout
                if ends is not None:
                    wait = min(wait, ends - time.monotonic())
                try:
                    async with asyncio.timeout(max(wait, 0.0)):
                        chunk = await content.readany()
                except TimeoutError:
                    if wait < self.timeout:
                        raise ClientBodyTimeout(
                            f"client did not send the whole body within {self.deadline:g}s"
                        ) from None
                    raise ClientBodyTimeout(f"client timed out ({self.timeout:g}s) while sending the body") from None
                if not chunk:
                    return
                self.received += len(chunk)
                if limit and self.received > limit:
                    raise BodyTooLarge()
                yield chunk
        except ClientBodyTimeout:
            raise
        except (ConnectionError, OSError) as exc:
            raise ClientBodyError(str(exc)) from exc
        except Exception as exc:  # aiohttp's payload errors (truncated or malformed chunked body)
            if isinstance(exc, BodyTooLarge):
                raise
            raise ClientBodyError(str(exc)) from exc

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()
