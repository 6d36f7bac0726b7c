"""Header rewriting between client and upstream (pure functions).

* Hop-by-hop headers (RFC 9110 §7.6.1) are removed in both directions, including
  every header named in ``Connection``.
* Towards the upstream: ``Host`` is kept (or replaced by the upstream's ``host``);
  ``X-Forwarded-For`` gets the peer's address appended; ``X-Forwarded-Proto``,
  ``X-Forwarded-Host`` and ``X-Real-IP`` are set. Forwarding headers that arrive
  from a peer outside ``real_ip.from`` are not trusted: they are replaced, not
  extended.
"""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

# Lower-case names, compared with name.lower(): multidict's istr hashes by its original
# spelling, so a set of istr would miss "keep-alive" sent in lower case.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Connection",
        "TE",
        "Transfer-Encoding",
        "Upgrade",
        "Trailer",
        "Proxy-Authenticate",
        "Proxy-Authorization",
    )
)
# Set by us (or by aiohttp) on the way to the upstream.
_REQUEST_REPLACED = frozenset(
    h.lower() for h in ("Host", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-IP", "Expect")
)
_WEBSOCKET_OWN = frozenset(
    h.lower()
    for h in ("Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Extensions", "Sec-WebSocket-Protocol")
)


def connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> frozenset[str]:
    values = headers.getall("Connection", ())
    if not values:
        return frozenset()
    return frozenset(t.strip().lower() for v in values for t in v.split(",") if t.strip())


def upstream_request_headers(
    incoming: CIMultiDictProxy[str],
    *,
    peer_ip: str,
    client_ip: str,
    trusted_peer: bool,
    scheme: str,
    host_override: str | None,
    websocket: bool = False,
) -> CIMultiDict[str]:
    named = connection_tokens(incoming)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in incoming.items():
        lname = name.lower()
        if lname in HOP_BY_HOP or lname in _REQUEST_REPLACED or (named and lname in named):
            continue
        if websocket and lname in _WEBSOCKET_OWN:
            continue
        out.add(name, value)
    host = incoming.get("Host", "")
    out["Host"] = host_override or host
    prior = ", ".join(incoming.getall("X-Forwarded-For", ())) if trusted_peer else ""
    out["X-Forwarded-For"] = f"{prior}, {peer_ip}" if prior else peer_ip
    out["X-Forwarded-Proto"] = (trusted_peer and incoming.get("X-Forwarded-Proto")) or scheme
    out["X-Forwarded-Host"] = (trusted_peer and incoming.get("X-Forwarded-Host")) or host
    out["X-Real-IP"] = client_ip
    return out


def client_response_headers(upstream: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """Upstream response headers minus hop-by-hop and framing (aiohttp re-frames the body)."""
    named = connection_tokens(upstream)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.items():
        lname = name.lower()
        if lname in HOP_BY_HOP or lname == "content-length" or (named and lname in named):
            continue
        out.add(name, value)
    return out


def is_websocket_upgrade(headers: CIMultiDictProxy[str]) -> bool:
    upgrade = headers.get("Upgrade")
    return upgrade is not None and upgrade.lower() == "websocket" and "upgrade" in connection_tokens(headers)


def request_head(
    method: str,
    target: str,
    incoming: CIMultiDictProxy[str],
    *,
    peer_ip: str,
    client_ip: str,
    trusted_peer: bool,
    scheme: str,
    host_override: str | None,
    content_length: int | None,
    chunked: bool,
) -> bytes:
    """The request head for the upstream, as bytes, in one pass over the client's headers.

    Framing is always ours: the client's Content-Length and Transfer-Encoding are
    dropped and replaced by the length we will send, or by chunked encoding. No
    header named in ``Connection`` can remove framing or Host (request smuggling).
    Header bytes go out exactly as they came in (aiohttp decodes them as UTF-8 with
    surrogate escapes; the same codec turns them back into the original bytes).
    """
    named = connection_tokens(incoming) - _FRAMING
    lines = [f"{method} {target} HTTP/1.1"]
    host = incoming.get("Host", "")
    prior = ""
    forwarded_proto = forwarded_host = ""
    for name, value in incoming.items():
        lname = name.lower()
        if lname in HOP_BY_HOP or lname in _REQUEST_REPLACED:
            if trusted_peer:
                if lname == "x-forwarded-for":
                    prior = f"{prior}, {value}" if prior else value
                elif lname == "x-forwarded-proto" and not forwarded_proto:
                    forwarded_proto = value
                elif lname == "x-forwarded-host" and not forwarded_host:
                    forwarded_host = value
            continue
        if lname == "content-length" or (named and lname in named):
            continue
        lines.append(f"{name}: {value}")
    lines.append(f"Host: {host_override or host}")
    lines.append(f"X-Forwarded-For: {prior}, {peer_ip}" if prior else f"X-Forwarded-For: {peer_ip}")
    lines.append(f"X-Forwarded-Proto: {forwarded_proto or scheme}")
    lines.append(f"X-Forwarded-Host: {forwarded_host or host}")
    lines.append(f"X-Real-IP: {client_ip}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    elif content_length is not None:
        lines.append(f"Content-Length: {content_length}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


_HOP_BYTES = frozenset(h.encode() for h in HOP_BY_HOP)
_FRAMING = frozenset({"content-length", "transfer-encoding", "host"})


def _text(value: bytes) -> str:
    # aiohttp writes header values as UTF-8 (dropping surrogates): UTF-8 passes through
    # unchanged; other bytes are read as Latin-1 rather than lost.
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def response_headers(raw: list[tuple[bytes, bytes]]) -> tuple[CIMultiDict[str], int | None]:
    """An upstream's raw response headers, minus hop-by-hop and framing; and its Content-Length."""
    named: set[bytes] = set()
    length: int | None = None
    for name, value in raw:
        lname = name.lower()
        if lname == b"connection":
            named.update(t.strip().lower() for t in value.split(b",") if t.strip())
        elif lname == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = None
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in raw:
        lname = name.lower()
        if lname in _HOP_BYTES or lname == b"content-length" or lname in named:
            continue
        out.add(name.decode("latin-1"), _text(value))
    return out, length
