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
from dataclasses import dataclass, field

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
    """The outcome of looking at the start of a packet that begins a request."""

    data: bytes  # what to feed the parser now (methods possibly renamed)
    held: bytes = b""  # a request whose method is not whole yet: kept until more arrives
    methods: list[str | None] = field(default_factory=list)  # per request start, in order: the real name if renamed
    http09: bool = False  # an HTTP/0.9 request line


def single_known_request(data: bytes) -> bool:
    """The usual packet, which needs no scan: one request with a method the parser knows,
    an HTTP/1.x request line, ending with the end of its header."""
    space = data.find(b" ", 0, MAX_METHOD + 1)
    if space <= 0 or data[:space] not in PARSER_METHODS:
        return False
    end = data.find(b"\r\n\r\n", space)
    return end == len(data) - 4 and data.find(b" HTTP/", space, data.find(b"\n", space)) > 0


def scan(data: bytes) -> Scan:
    """Look at ``data``, which starts a request (after optional empty lines).

    Pipelined requests that follow a complete header without a body are looked at too,
    so a custom method is proxied wherever it stands in a packet. The walk stops at a
    header that may carry a body or an upgrade: only the parser can tell where that ends.
    """
    out = bytearray()
    methods: list[str | None] = []
    pos = 0
    size = len(data)
    while True:
        start = pos
        while start < size and data[start] in (13, 10):  # empty lines before a request are ignored
            start += 1
        if start == size:
            out += data[pos:]
            return Scan(bytes(out), methods=methods)
        space = data.find(b" ", start, start + MAX_METHOD + 1)
        if space < 0:
            token = data[start : start + MAX_METHOD + 1]
            if len(token) <= MAX_METHOD and _NGINX_METHOD.fullmatch(token):
                out += data[pos:start]
                return Scan(bytes(out), held=data[start:], methods=methods)  # the method goes on later
            out += data[pos:]
            return Scan(bytes(out), methods=methods)  # not a method: the parser will say so
        if not methods:
            line_end = data.find(b"\n", space)
            if line_end >= 0 and b" HTTP/" not in data[space:line_end]:
                return Scan(data, http09=True)
        token = data[start:space]
        if not _NGINX_METHOD.fullmatch(token):
            out += data[pos:]
            return Scan(bytes(out), methods=methods)  # the parser refuses it
        if token in PARSER_METHODS:
            out += data[pos:space]
            methods.append(None)
        else:
            out += data[pos:start] + _PLACEHOLDER
            methods.append(token.decode("ascii"))
        end = data.find(b"\r\n\r\n", space)
        body = -1 if end < 0 else _body_length(data, space, end + 2)
        if body < 0:
            out += data[space:]
            return Scan(bytes(out), methods=methods)
        out += data[space : end + 4 + body]
        pos = end + 4 + body


# Header lines the walk cannot see past (a chunked body, a protocol switch), and Content-Length.
# Names are matched without regard to case, as llhttp matches them.
_UNKNOWN_END = re.compile(rb"\n(?:transfer-encoding|upgrade)[ \t]*:", re.IGNORECASE)
_CONTENT_LENGTH = re.compile(rb"\ncontent-length[ \t]*:([^\r\n]*)", re.IGNORECASE)


def _body_length(data: bytes, start: int, end: int) -> int:
    """The body length of the request whose header is ``data[start:end]``; -1 if not known here."""
    if _UNKNOWN_END.search(data, start, end):
        return -1
    lengths = _CONTENT_LENGTH.findall(data, start, end)
    if not lengths:
        return 0
    if len(lengths) > 1 or not lengths[0].strip(b" \t").isdigit():
        return -1  # the parser refuses it, or decides: not ours to guess
    return int(lengths[0].strip(b" \t"))
