"""What the gateway checks in a request line before aiohttp's C parser (llhttp) sees it.

llhttp knows a fixed list of methods and refuses any other token; nginx proxies
any method made of ``A-Z``, ``_`` and ``-``. ``Framer`` follows where each request
starts in a connection's bytes (past ``Content-Length`` and chunked bodies, across
packets); there it renames such a method to ``GET`` for the parser (a method does
not change how a request is framed) and reports the real name, which the protocol
puts back on the parsed message. It cuts a packet into one part per request, so a
parse error loses none of the requests before it, and stops at a request that asks
to switch protocols, so a declined switch loses none after it. It also spots an
HTTP/0.9 request line (``GET /x`` and nothing more), which llhttp would wait on forever.

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


def single_known_request(data: bytes) -> bool:
    """The usual packet, which needs no scan: one request with a method the parser knows,
    an HTTP/1.x request line, ending with the end of its header."""
    space = data.find(b" ", 0, MAX_METHOD + 1)
    if space <= 0 or data[:space] not in PARSER_METHODS:
        return False
    end = data.find(b"\r\n\r\n", space)
    return end == len(data) - 4 and data.find(b" HTTP/", space, data.find(b"\n", space)) > 0


@dataclass(slots=True)
class Scan:
    """What to do with a packet: feed ``parts`` to the parser one after the other, then ``rest``."""

    parts: list[bytes]  # each ends where a request ends (the last may end inside one)
    held: bytes = b""  # a request whose method is not whole yet: kept until more arrives
    methods: list[str | None] = field(default_factory=list)  # per request start, in order: the real name if renamed
    http09: bool = False  # an HTTP/0.9 request line
    rest: bytes = b""  # the bytes after a request that asks to switch protocols: the parser decides


# Where the framer stands in the byte stream.
BOUNDARY, HEADER, BODY, CHUNK_SIZE, CHUNK_DATA, CHUNK_END, TRAILER, UNKNOWN = range(8)
_MAX_LINE = 4096  # a chunk-size or trailer line longer than this: the framer stops following
_MAX_HEADER = 1 << 20  # a header longer than this is the parser's to refuse, not ours to keep


class Framer:
    """Follows where each request starts in the bytes of one connection, across packets.

    llhttp knows where requests end; the framer must know it too, to rename a custom method
    wherever a request starts: after a ``Content-Length`` body, after a chunked body (its
    chunk lines followed byte by byte, as llhttp frames them: strictly, CRLF only), in the
    middle of a packet or at the start of the next one. A request that asks to switch
    protocols (``Upgrade``, ``CONNECT``) ends the scan of a packet: what follows is the
    parser's to hand over (a WebSocket) or to go on parsing (a declined upgrade).

    Whatever the framer is unsure of (a framing llhttp would refuse, an odd chunk line),
    it stops following (``UNKNOWN``) and leaves the bytes as they are: the parser's verdict
    stands, and the framer picks up again at the next packet that ends with a whole header.
    The framer never changes framing; at worst a custom method it lost track of gets 400.
    """

    __slots__ = ("connect", "header", "line", "remaining", "state")

    def __init__(self) -> None:
        self.state = BOUNDARY
        self.remaining = 0  # BODY, CHUNK_DATA: the bytes still to come
        self.header = b""  # HEADER: the part of the header seen so far
        self.line = b""  # CHUNK_SIZE, TRAILER: the part of the line seen so far
        self.connect = False  # HEADER: the request is a CONNECT

    @property
    def at_boundary(self) -> bool:
        return self.state == BOUNDARY

    def lost(self) -> None:
        self.state = UNKNOWN
        self.header = self.line = b""

    def single(self, data: bytes) -> bool:
        """For the usual packet (``single_known_request``): step past it, True if nothing follows
        that the framer must split off (no protocol switch asked for)."""
        framing = _SWITCH if data.startswith(b"CONNECT ") else _framing(data, 0, len(data))
        if framing == _SWITCH:
            return False
        self._start_body(framing)
        return True

    def scan(self, data: bytes) -> Scan:
        out = Scan([])
        part = bytearray()
        pos = 0
        size = len(data)
        while pos < size:
            state = self.state
            if state == UNKNOWN:
                part += data[pos:]
                break
            if state == BOUNDARY:
                start = pos
                while start < size and data[start] in (13, 10):  # empty lines before a request are ignored
                    start += 1
                if start == size:
                    part += data[pos:]
                    break
                space = data.find(b" ", start, start + MAX_METHOD + 1)
                if space < 0:
                    token = data[start : start + MAX_METHOD + 1]
                    if len(token) <= MAX_METHOD and _NGINX_METHOD.fullmatch(token):
                        part += data[pos:start]
                        out.held = data[start:]  # the method goes on later
                        break
                    self.lost()  # not a method: the parser will say so
                    continue
                line_end = data.find(b"\n", space)
                if line_end >= 0 and b" HTTP/" not in data[space:line_end]:
                    if not out.methods and not out.parts and not part:
                        return Scan([], http09=True)
                    self.lost()  # the parser refuses it after the requests before it
                    continue
                token = data[start:space]
                if not _NGINX_METHOD.fullmatch(token):
                    self.lost()  # the parser refuses it
                    continue
                if token in PARSER_METHODS:
                    part += data[pos:space]
                    out.methods.append(None)
                else:
                    part += data[pos:start] + _PLACEHOLDER
                    out.methods.append(token.decode("ascii"))
                pos = space
                self.state = HEADER
                self.connect = token == b"CONNECT"
                self.header = b""
                continue
            if state == HEADER:
                seen = len(self.header)
                look = max(0, seen - 3)
                joined = self.header + data[pos:] if seen else data[pos:] if pos else data
                end = joined.find(b"\r\n\r\n", look)
                if end < 0:
                    if len(joined) > _MAX_HEADER:
                        self.lost()
                    else:
                        self.header = joined
                    part += data[pos:]
                    break
                header_end = end + 4
                consumed = header_end - seen
                part += data[pos : pos + consumed]
                pos += consumed
                self.header = b""
                framing = _SWITCH if self.connect else _framing(joined, 0, header_end)
                if framing == _SWITCH:
                    out.parts.append(bytes(part))
                    out.rest = data[pos:]
                    self.state = BOUNDARY  # if the parser declines the switch, a request starts here
                    return out
                self._start_body(framing)
                if self.state == BOUNDARY:
                    out.parts.append(bytes(part))
                    part = bytearray()
                continue
            if state in (BODY, CHUNK_DATA):
                take = min(self.remaining, size - pos)
                part += data[pos : pos + take]
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    if state == BODY:
                        self.state = BOUNDARY
                        out.parts.append(bytes(part))
                        part = bytearray()
                    else:
                        self.state = CHUNK_END
                        self.line = b""
                continue
            # CHUNK_SIZE, CHUNK_END, TRAILER: a line, which may be split across packets
            cut = data.find(b"\n", pos)
            if cut < 0:
                self.line += data[pos:]
                part += data[pos:]
                if len(self.line) > _MAX_LINE:
                    self.lost()
                break
            line = self.line + data[pos : cut + 1]
            part += data[pos : cut + 1]
            pos = cut + 1
            self.line = b""
            if not line.endswith(b"\r\n"):
                self.lost()
            elif state == CHUNK_END:
                if line == b"\r\n":
                    self.state = CHUNK_SIZE
                else:
                    self.lost()
            elif state == CHUNK_SIZE:
                digits = _CHUNK_SIZE.match(line)
                if digits is None:
                    self.lost()
                else:
                    length = int(digits.group(1), 16)
                    if length:
                        self.state, self.remaining = CHUNK_DATA, length
                    else:
                        self.state = TRAILER
            elif line == b"\r\n":  # the end of the trailer: the request is whole
                self.state = BOUNDARY
                out.parts.append(bytes(part))
                part = bytearray()
        if part:
            out.parts.append(bytes(part))
        return out

    def _start_body(self, framing: int) -> None:
        if framing == 0:
            self.state = BOUNDARY
        elif framing == _CHUNKED:
            self.state = CHUNK_SIZE
            self.line = b""
        elif framing > 0:
            self.state, self.remaining = BODY, framing
        else:
            self.lost()


# A chunk-size line as llhttp takes it: hex digits, extensions, CRLF (extensions are llhttp's to judge).
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})(?:;[^\r\n]*)?\r\n\Z")
# The header lines that decide framing; names matched without regard to case, as llhttp matches them.
_FRAMING_FIELD = re.compile(rb"\n(content-length|transfer-encoding|upgrade)[ \t]*:([^\r\n]*)", re.IGNORECASE)
_CHUNKED = -2  # a chunked body
_SWITCH = -3  # a protocol switch is asked for (Upgrade, CONNECT)
_LOST = -1  # not known here: the parser refuses it, or decides


def _framing(data: bytes, start: int, end: int) -> int:
    """How the request whose header is ``data[start:end]`` frames its body: its length,
    ``_CHUNKED``, ``_SWITCH`` or ``_LOST``."""
    fields = _FRAMING_FIELD.findall(data, start, end)
    if not fields:
        return 0
    length = -1
    coding = switch = False
    for name, value in fields:
        name = name.lower()
        if name == b"upgrade":
            switch = True
        elif name == b"transfer-encoding":
            if coding or value.strip(b" \t").lower() != b"chunked":
                return _LOST  # 501, or a list: not ours to follow
            coding = True
        else:
            value = value.strip(b" \t")
            if length >= 0 or not value.isdigit():
                return _LOST  # the parser refuses it
            length = int(value)
    if switch:  # with a body, the switch waits for its end: not followed here
        return _SWITCH if length <= 0 and not coding else _LOST
    if coding:
        return _LOST if length >= 0 else _CHUNKED  # both: the parser refuses it
    return length
