"""Header rewriting between client and upstream (pure functions).

* Hop-by-hop headers (RFC 9110 §7.6.1) are removed in both directions, including
  every header named in ``Connection``.
* Towards the upstream: ``Host`` is kept (or replaced by the upstream's ``host``);
  ``X-Forwarded-For`` gets the peer's address appended; ``X-Forwarded-Proto``,
  ``X-Forwarded-Host`` and ``X-Real-IP`` are set. Forwarding headers that arrive
  from a peer outside ``real_ip.from`` are not trusted: they are replaced, not
  extended.
* Headers that name the client or the original URL (``Forwarded``, ``True-Client-IP``,
  ``X-Client-IP``, ``X-Cluster-Client-IP``, ``X-Original-URL``, ``X-Rewrite-URL``) are not
  passed on: a backend that believes them could be told any client or any path. A route
  that wants one sets it itself, as in nginx: ``proxy_set_header: {Forwarded: $http_forwarded}``.
  A name with ``_`` is not passed on either (nginx's ``underscores_in_headers off``: to a
  backend that maps ``_`` and ``-`` alike, ``X_Forwarded_For`` is ``X-Forwarded-For``),
  unless ``underscores_in_headers: on``.
* WebSocket: the handshake gets our ``Connection: upgrade`` and ``Upgrade: websocket``
  (the client's Sec-WebSocket-* pass as they are); the upstream's 101 keeps all its
  end-to-end headers and gets ``Upgrade`` and ``Connection: upgrade`` back.
"""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

# proxy_set_header for one request: the lower-case names it sets or removes, and the
# (name, value) fields it adds (those with an empty value are removed only).
SetFields = tuple[frozenset[str], list[tuple[str, str]]]

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


# Named by the client about itself or about the URL: never passed on as sent.
CLIENT_NAMING = frozenset(
    ("forwarded", "true-client-ip", "x-client-ip", "x-cluster-client-ip", "x-original-url", "x-rewrite-url")
)
_underscores = [False]  # underscores_in_headers, set from the configuration (set_underscores_in_headers)


def set_underscores_in_headers(on: bool) -> None:
    """nginx's ``underscores_in_headers``: whether a header name with ``_`` is passed to upstreams."""
    _underscores[0] = on


def connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> frozenset[str]:
    values = headers.getall("Connection", ())
    if not values:
        return frozenset()
    return frozenset(t.strip().lower() for v in values for t in v.split(",") if t.strip())


def _upstream_fields(
    incoming: CIMultiDictProxy[str],
    skip: frozenset[str],
    named: frozenset[str],
    *,
    peer_ip: str,
    client_ip: str,
    trusted_peer: bool,
    scheme: str,
    host_override: str | None,
    set_fields: SetFields | None = None,
) -> list[tuple[str, str]]:
    """The client's headers minus hop-by-hop, ``skip`` and those ``named`` in Connection,
    then Host and the forwarding headers, in one pass; then the route's ``proxy_set_header``.

    Forwarding headers from an untrusted peer are replaced, not extended."""
    fields: list[tuple[str, str]] = []
    host = incoming.get("Host", "")
    prior = forwarded_proto = forwarded_host = ""
    for item in incoming.items():
        lname = item[0].lower()
        if lname in HOP_BY_HOP or lname in _REQUEST_REPLACED:
            if trusted_peer:
                if lname == "x-forwarded-for":
                    prior = f"{prior}, {item[1]}" if prior else item[1]
                elif lname == "x-forwarded-proto" and not forwarded_proto:
                    forwarded_proto = item[1]
                elif lname == "x-forwarded-host" and not forwarded_host:
                    forwarded_host = item[1]
            continue
        if lname in skip or (named and lname in named) or lname in CLIENT_NAMING:
            continue
        if "_" in lname and not _underscores[0]:
            continue
        fields.append(item)
    fields.append(("Host", host_override or host))
    fields.append(("X-Forwarded-For", f"{prior}, {peer_ip}" if prior else peer_ip))
    fields.append(("X-Forwarded-Proto", forwarded_proto or scheme))
    fields.append(("X-Forwarded-Host", forwarded_host or host))
    fields.append(("X-Real-IP", client_ip))
    if set_fields is not None:
        names, values = set_fields
        fields = [item for item in fields if item[0].lower() not in names]
        fields += values
    return fields


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
    set_fields: SetFields | None = None,
    upgrade: bool = False,
) -> bytes:
    """The request head for the upstream, as bytes, in one pass over the client's headers.

    Framing is always ours: the client's Content-Length and Transfer-Encoding are
    dropped and replaced by the length we will send, or by chunked encoding. No
    header named in ``Connection`` can remove framing or Host (request smuggling).
    Header bytes go out exactly as they came in (aiohttp decodes them as UTF-8 with
    surrogate escapes; the same codec turns them back into the original bytes).

    ``upgrade``: a WebSocket handshake, as nginx sends it with ``proxy_set_header Upgrade
    websocket`` and ``proxy_set_header Connection upgrade`` (the client's Sec-WebSocket-*
    pass as they are); it has no body.
    """
    fields = _upstream_fields(
        incoming,
        _CONTENT_LENGTH,
        connection_tokens(incoming) - _FRAMING,
        peer_ip=peer_ip,
        client_ip=client_ip,
        trusted_peer=trusted_peer,
        scheme=scheme,
        host_override=host_override,
        set_fields=set_fields,
    )
    if upgrade:
        fields.append(("Connection", "upgrade"))
        fields.append(("Upgrade", "websocket"))
    elif chunked:
        fields.append(("Transfer-Encoding", "chunked"))
    elif content_length is not None:
        fields.append(("Content-Length", str(content_length)))
    return _head_bytes(method, target, fields)


def _head_bytes(method: str, target: str, fields: list[tuple[str, str]]) -> bytes:
    lines = [f"{method} {target} HTTP/1.1"]
    lines += map(": ".join, fields)
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


_HOP_BYTES = frozenset(h.encode() for h in HOP_BY_HOP)
_FRAMING = frozenset({"content-length", "transfer-encoding", "host"})
_CONTENT_LENGTH = frozenset({"content-length"})


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


def switch_response_headers(raw: list[tuple[bytes, bytes]]) -> CIMultiDict[str]:
    """The headers of an upstream's 101 for the client: all of them (Set-Cookie,
    Sec-WebSocket-Accept, -Protocol, -Extensions ...) minus hop-by-hop and framing, then
    the upstream's ``Upgrade`` and ``Connection: upgrade``, which make it a 101."""
    headers, _ = response_headers(raw)
    upgrade = next((_text(value) for name, value in raw if name.lower() == b"upgrade"), "websocket")
    headers["Upgrade"] = upgrade
    headers["Connection"] = "upgrade"
    return headers
