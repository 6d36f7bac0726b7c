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

from multidict import CIMultiDict, CIMultiDictProxy, istr

HOP_BY_HOP = frozenset(
    istr(h)
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
    istr(h) for h in ("Host", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-IP", "Expect")
)
_WEBSOCKET_OWN = frozenset(
    istr(h)
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
        if name in HOP_BY_HOP or name in _REQUEST_REPLACED:
            continue
        if named and name.lower() in named:
            continue
        if websocket and name in _WEBSOCKET_OWN:
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
        if name in HOP_BY_HOP or name == "Content-Length":
            continue
        if named and name.lower() in named:
            continue
        out.add(name, value)
    return out


def is_websocket_upgrade(headers: CIMultiDictProxy[str]) -> bool:
    upgrade = headers.get("Upgrade")
    return upgrade is not None and upgrade.lower() == "websocket" and "upgrade" in connection_tokens(headers)
