"""What the gateway checks in a request line before aiohttp's C parser (llhttp) sees it.

llhttp knows a fixed list of methods and refuses any other token; nginx proxies
any method made of ``A-Z``, ``_`` and ``-``. At a point where the next byte
starts a request, ``scan`` renames such a method to ``GET`` for the parser (a
method does not change how a request is framed) and reports the real name, which
the protocol puts back on the parsed message. It also spots an HTTP/0.9 request
line (``GET /x`` and nothing more), which llhttp would wait on forever.

The accepted methods are read off the parser itself at import, so the list follows
the llhttp that aiohttp vendors.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from aiohttp.http_parser import HttpRequestParser

MAX_METHOD = 32
_NGINX_METHOD = re.compile(rb"[A-Z_-]{1,32}")
_PLACEHOLDER = b"GET"


def _probe_methods() -> frozenset[bytes]:
    """The methods this aiohttp's request parser accepts."""

    class _Sink:
        transport = None

        def pause_reading(self) -> None:
            return None

        def resume_reading(self, resume_parser: bool = True) -> None:
            return None

    candidates = (
        ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH", "COPY", "LOCK", "MKCOL", "MOVE")
        + ("PROPFIND", "PROPPATCH", "SEARCH", "UNLOCK", "BIND", "REBIND", "UNBIND", "ACL", "REPORT", "MKACTIVITY")
        + ("CHECKOUT", "MERGE", "M-SEARCH", "NOTIFY", "SUBSCRIBE", "UNSUBSCRIBE", "PURGE", "MKCALENDAR", "LINK")
        + ("UNLINK", "SOURCE", "QUERY")
    )
    loop = asyncio.new_event_loop()
    accepted = set()
    try:
        for method in candidates:
            parser = HttpRequestParser(_Sink(), loop, 65536)  # type: ignore[arg-type]
            try:
                messages, _, _ = parser.feed_data(method.encode() + b" / HTTP/1.1\r\nHost: a\r\n\r\n")
            except Exception:
                continue
            if messages:
                accepted.add(method.encode())
    finally:
        loop.close()
    return frozenset(accepted)


PARSER_METHODS = _probe_methods()


@dataclass(slots=True)
class Scan:
    """The outcome of looking at the start of a request."""

    data: bytes  # what to feed the parser (the method possibly renamed)
    method: str | None = None  # the real method when it was renamed
    wait: bool = False  # too little to decide: keep ``data`` and wait for more
    http09: bool = False  # an HTTP/0.9 request line


def scan(data: bytes) -> Scan:
    """Look at ``data``, which starts a request (after optional empty lines)."""
    start = 0
    size = len(data)
    while start < size and data[start] in (13, 10):  # empty lines before a request are ignored
        start += 1
    if start == size:
        return Scan(data)
    space = data.find(b" ", start, start + MAX_METHOD + 1)
    if space < 0:
        token = data[start : start + MAX_METHOD + 1]
        if len(token) <= MAX_METHOD and _NGINX_METHOD.fullmatch(token):
            return Scan(data, wait=True)  # the method may go on in the next packet
        return Scan(data)  # not a method: the parser will say so
    line_end = data.find(b"\n", space)
    if line_end >= 0 and b" HTTP/" not in data[space:line_end]:
        return Scan(data, http09=True)
    token = data[start:space]
    if token in PARSER_METHODS or not _NGINX_METHOD.fullmatch(token):
        return Scan(data)
    return Scan(data[:start] + _PLACEHOLDER + data[space:], method=token.decode("ascii"))
