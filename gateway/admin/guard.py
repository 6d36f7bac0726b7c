"""Checks that keep web pages away from the admin API, made before the token is looked at.

A browser can be made to send requests to 127.0.0.1:9180 by any page it visits:
a "simple" cross-origin POST (text/plain, no preflight), or a page on a domain
that the attacker re-points at 127.0.0.1 (DNS rebinding), which the browser
then treats as same-origin. So:

* a mutating call must be ``Content-Type: application/json`` (a browser cannot
  send that cross-origin without a preflight, and preflights are refused);
* a request with an ``Origin`` other than the listener's own is refused, and so
  is one a browser marks ``Sec-Fetch-Site: cross-site`` or ``same-site``, except
  a top-level navigation to the status page (a link from a runbook): that page
  holds no data, cannot be framed, and its own calls are same-origin;
* on a loopback listener the ``Host`` must be a loopback name or address.

Each check returns the refusal's reason, or None; none echoes request bytes.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gateway.config.validate import is_loopback_host

if TYPE_CHECKING:
    from aiohttp import web

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_PORT = re.compile(r"[0-9]{1,5}")


def host_of(authority: str) -> str | None:
    """The host of ``host[:port]`` / ``[v6][:port]``; None when it is not of that shape."""
    text = authority.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        host, rest = text[: end + 1], text[end + 1 :]
    else:
        host, sep, port = text.partition(":")
        rest = sep + port
    if rest and not (rest.startswith(":") and _PORT.fullmatch(rest[1:])):
        return None
    return host or None


def refusal(request: web.Request, *, loopback_listener: bool, page: bool = False) -> tuple[int, str] | None:
    """(status, reason) when the request must be refused before authentication.

    ``page``: the request is for the status page's HTML (public, without data)."""
    headers = request.headers
    if request.method == "OPTIONS":
        return 403, "the admin API does not answer CORS preflights"
    if loopback_listener:
        for value in headers.getall("Host", ()):
            host = host_of(value)
            if host is None or not is_loopback_host(host):
                return 403, "the Host header must name this machine's loopback (localhost, 127.0.0.1, [::1])"
    origins = headers.getall("Origin", ())
    if origins and not all(_own_origin(request, origin) for origin in origins):
        return 403, "cross-origin requests are refused"
    if headers.get("Sec-Fetch-Site", "").strip().lower() in ("cross-site", "same-site") and not (
        page and request.method in ("GET", "HEAD") and _navigation(request)
    ):
        return 403, "cross-site requests are refused"
    if request.method in MUTATING and request.content_type != "application/json":
        return 415, "this call needs Content-Type: application/json"
    return None


def _navigation(request: web.Request) -> bool:
    """A browser opening a document in a tab (not a fetch, not a frame: the page also forbids framing)."""
    headers = request.headers
    return (
        headers.get("Sec-Fetch-Mode", "").strip().lower() == "navigate"
        and headers.get("Sec-Fetch-Dest", "").strip().lower() == "document"
    )


def _own_origin(request: web.Request, origin: str) -> bool:
    """True when ``origin`` is ``http://<the address this connection came in on>:<port>``
    (or ``localhost`` on a loopback address)."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if not sockname:
        return False
    address, port = str(sockname[0]), int(sockname[1])
    hosts = {f"[{address}]" if ":" in address else address}
    if is_loopback_host(address):
        hosts.add("localhost")
    suffixes = (f":{port}", "") if port == 80 else (f":{port}",)
    allowed = {f"http://{host}{suffix}" for host in hosts for suffix in suffixes}
    return origin.strip().lower() in allowed
