"""The status page's files, served with the headers that keep them inert.

``page.html`` carries no data and no inline script or style: ``page.js`` fetches
``/status/activity`` and ``/bans`` with the admin token (kept in ``sessionStorage``)
and writes every request-derived string with ``textContent``. The Content-Security-Policy
allows only this origin's script, style and fetches, and no framing.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from aiohttp import web

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_TYPES = {
    "page.html": "text/html",
    "page.js": "text/javascript",
    "page.css": "text/css",
    "favicon.ico": "image/svg+xml",  # an SVG: browsers sniff the icon, whatever the name
}
_FILES = {"favicon.ico": "favicon.svg"}


@cache
def _read(name: str) -> bytes:
    return resources.files("gateway.admin.statuspage").joinpath(_FILES.get(name, name)).read_bytes()


def response(name: str) -> web.Response:
    """One of the page's files (404 for any other name)."""
    content_type = _TYPES.get(name)
    if content_type is None:
        raise web.HTTPNotFound()
    headers = {
        "Content-Security-Policy": CSP,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    charset = "utf-8" if content_type.startswith("text/") else None
    return web.Response(body=_read(name), content_type=content_type, charset=charset, headers=headers)
