"""A proxied response's status line and header, composed as bytes and written in one buffer.

aiohttp's ``StreamResponse`` builds a header dict, fills in framing, ``Date``, ``Server``
and ``Connection`` in ``prepare`` and serialises the dict again: a fifth of a proxied
request. Here the upstream's raw header lines become the client's in one pass, with the
same rules aiohttp's ``prepare`` applies, and go to the transport through the request's own
``StreamWriter``, inside aiohttp's server (its protocol, parser and keep-alive handling):

* hop-by-hop headers, every header named in ``Connection``, ``Content-Length`` and
  ``X-Accel-Buffering`` are dropped; a header's bytes pass as they came when they are
  UTF-8, and are read as Latin-1 and sent as UTF-8 when not (what the header dict did);
* the route's extra headers replace the upstream's of the same name, ``add_header``
  lines are added after them (``ETag`` and ``Last-Modified`` replace the upstream's, as
  nginx's; an empty value removes them);
* framing is ours: ``Content-Length`` when the length is known, else chunked on HTTP/1.1,
  else the end of the connection (HTTP/1.0: no keep-alive); a HEAD answer keeps the
  upstream's length, 204 and 304 have neither; no ``Content-Type`` is invented;
* ``Date`` and ``Server`` (``server_tokens``) are added when missing; ``Connection:
  close`` on HTTP/1.1 when the connection ends, ``keep-alive`` on HTTP/1.0 when it does not;
* a CR or LF inside a field is refused (``ValueError``), as aiohttp's serialiser refuses it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from aiohttp import web, web_response
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import HttpVersion, HttpVersion10, HttpVersion11
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.http.addheader import ADD_HEADER_STATUSES, AddedHeader

if TYPE_CHECKING:
    from aiohttp.http_writer import StreamWriter

    from gateway.http.context import RequestContext

_DATE, _SERVER, _CONNECTION = 1, 2, 4
_SEEN = {b"date": _DATE, b"server": _SERVER, b"connection": _CONNECTION}
_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"transfer-encoding", b"upgrade", b"trailer"}
    | {b"proxy-authenticate", b"proxy-authorization"}
)
_DROPPED = _HOP_BY_HOP | {b"content-length", b"x-accel-buffering"}
_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
_NOTHING_DONE: set[bytes] = set()  # never added to: only read when there is nothing to replace


class ProxiedResponse(web.StreamResponse):
    """A response the relay has written itself: aiohttp's ``finish_response`` finds it sent.

    It carries what aiohttp's protocol and the access log read afterwards: the status,
    keep-alive, and the bytes written. Its header dict is empty; the header went out as bytes.
    """

    def __init__(self, status: int, reason: str, keep_alive: bool) -> None:  # no super(): nothing to fill
        self._state = {}
        self._headers = _NO_HEADERS  # type: ignore[assignment]
        self._status = status
        self._reason = reason
        self._keep_alive = keep_alive
        self._eof_sent = True  # prepare() and write_eof() have nothing left to do


class Head:
    """The client's response header, built from the upstream's (one per response)."""

    __slots__ = ("accel", "length", "lines", "seen")

    def __init__(self, raw: list[tuple[bytes, bytes]], extra: Sequence[tuple[str, str]]) -> None:
        self.lines: list[bytes] = []
        self.length: int | None = None
        self.accel: bytes | None = None  # the upstream's last X-Accel-Buffering
        self.seen = 0
        named = self._take(raw, extra, frozenset())
        if named:  # rare: Connection names end-to-end headers; they go too
            self.lines = []
            self.seen = 0
            self._take(raw, extra, named)

    def _take(
        self, raw: list[tuple[bytes, bytes]], extra: Sequence[tuple[str, str]], named: frozenset[bytes]
    ) -> frozenset[bytes]:
        lines = self.lines
        seen = 0
        tokens: set[bytes] | None = None
        replace = None
        done: set[bytes] = _NOTHING_DONE
        if extra:
            replace = {}  # (a loop, not a comprehension: that is a function call on Python 3.11)
            for field in extra:
                replace[_lower_name(field[0])] = field
            done = set()
        for name, value in raw:
            lname = name.lower()
            if lname in _DROPPED:
                if lname == b"content-length":
                    try:
                        self.length = int(value)
                    except ValueError:
                        self.length = None
                elif lname == b"x-accel-buffering":
                    self.accel = value
                elif lname == b"connection":
                    if tokens is None:
                        tokens = set()
                    tokens.update(t.strip().lower() for t in value.split(b","))
                continue
            if named and lname in named:
                continue
            if replace is not None and lname in replace:
                if lname in done:
                    continue  # replaced already, at its first place (as CIMultiDict's __setitem__)
                done.add(lname)
                lines.append(_field_line(replace[lname]))
            else:
                if not name.isascii():
                    name = name.decode("latin-1").encode("utf-8")
                lines.append(name + b": " + (value if value.isascii() else _utf8(value)))
            seen |= _SEEN.get(lname, 0)
        if replace is not None:
            for lname, field in replace.items():
                if lname not in done:
                    lines.append(_field_line(field))
                    seen |= _SEEN.get(lname, 0)
        self.seen = seen
        if tokens is None or named:
            return frozenset()
        return frozenset(tokens - _DROPPED - {b""})

    def add(self, added: tuple[AddedHeader, ...], status: int, ctx: RequestContext) -> None:
        """nginx's ``add_header`` (see gateway/http/addheader.py): appended; ``ETag`` and
        ``Last-Modified`` replace the upstream's (an empty value removes them)."""
        listed = status in ADD_HEADER_STATUSES
        for header in added:
            if listed or header.always:
                value = header.value(ctx)
                if header.replaces:
                    prefix = header.name.lower().encode("latin-1") + b":"
                    self.lines = [line for line in self.lines if line[: len(prefix)].lower() != prefix]
                if value:
                    self.lines.append(_str_line(header.name, value))
                    self.seen |= _SEEN.get(header.name.lower().encode("latin-1"), 0)

    def compose(
        self,
        version: HttpVersion,
        keep_alive: bool,
        status: int,
        reason: str,
        length: int | None,
        *,
        no_body: bool,
        head: bool,
    ) -> tuple[bytes, bool, bool]:
        """The header as bytes, whether the connection stays open, and whether the body is chunked.

        ``version``, ``keep_alive``: the client's request's; ``length``: the body's, or None
        (unknown); ``no_body``: HEAD, 204 or 304; ``head``: a HEAD request (it keeps the
        length of the body it would have had)."""
        chunked = False
        lines = self.lines
        if no_body:
            if head and length is not None and status not in (204, 304):
                lines.append(b"Content-Length: %d" % length)
        elif length is not None:
            lines.append(b"Content-Length: %d" % length)
        elif version == HttpVersion11:
            chunked = True
            lines.append(b"Transfer-Encoding: chunked")
        else:
            keep_alive = False  # HTTP/1.0 and no length: the end of the connection is the end of the body
        seen = self.seen
        if not seen & _DATE:
            lines.append(_date_line())
        if not seen & _SERVER:
            lines.append(_server_line())
        if not seen & _CONNECTION:
            if keep_alive:
                if version == HttpVersion10:
                    lines.append(b"Connection: keep-alive")
            elif version == HttpVersion11:
                lines.append(b"Connection: close")
        status_line = _status_line(version, status, reason)
        data = b"\r\n".join([status_line, *lines, b"\r\n"])
        # One CRLF per line and two at the end, and no other CR or LF: no field can split the header.
        breaks = len(lines) + 2
        if data.count(b"\n") != breaks or data.count(b"\r") != breaks:
            raise ValueError("Newline or carriage return character detected in HTTP status header")
        return data, keep_alive, chunked


def writer_of(request: web.BaseRequest) -> StreamWriter:
    return cast("StreamWriter", request.writer)


def send(writer: StreamWriter, head: bytes, body: bytes = b"") -> None:
    """Header and (small) body in one write, counted as aiohttp counts its own."""
    if body:
        writer._writelines((head, body))
    else:
        writer._write(head)


STATUS_LINES_MAX = 512  # the reason phrase is the upstream's: any text, so the cache is bounded


@functools.lru_cache(maxsize=STATUS_LINES_MAX)
def _status_line(version: HttpVersion, status: int, reason: str) -> bytes:
    return f"HTTP/{version.major}.{version.minor} {status} {reason}".encode()


# The extra fields are the gateway's own (RateLimit-Policy, RateLimit): few names, and values
# that repeat from one request to the next. Both caches are bounded all the same.
FIELD_CACHE_MAX = 1024


@functools.lru_cache(maxsize=FIELD_CACHE_MAX)
def _lower_name(name: str) -> bytes:
    return name.lower().encode("latin-1")


@functools.lru_cache(maxsize=FIELD_CACHE_MAX)
def _field_line(field: tuple[str, str]) -> bytes:
    return _str_line(*field)


def _str_line(name: str, value: str) -> bytes:
    return f"{name}: {value}".encode()


def _utf8(value: bytes) -> bytes:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1").encode("utf-8")
    return value


_date_cache: tuple[str, bytes] = ("", b"")
_server_cache: tuple[str, bytes] = ("", b"")


def _date_line() -> bytes:
    global _date_cache
    text = rfc822_formatted_time()  # aiohttp's own, cached per second
    if text is not _date_cache[0]:
        _date_cache = (text, f"Date: {text}".encode())
    return _date_cache[1]


def _server_line() -> bytes:
    """aiohttp's default Server, which ``server_tokens`` sets (gateway.edge.set_server_tokens)."""
    global _server_cache
    software: str = web_response.SERVER_SOFTWARE  # type: ignore[attr-defined]
    if software is not _server_cache[0]:
        _server_cache = (software, f"Server: {software}".encode())
    return _server_cache[1]
