"""Who may call the admin API: the browser checks first (``guard.py``), then the bearer token.

Every call but the two probes and the status page's own files needs
``Authorization: Bearer <token>``: ``admin.token``, or, when none is configured, a random
one written to ``admin.token_file`` for the CLI (``token.py``). The token is compared in
constant time, and a refusal never echoes what the request sent.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from aiohttp import web

from gateway.admin import guard

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="gateway admin"'}  # sent with every 401


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused before any handler runs: its status, reason and extra headers."""

    status: int
    reason: str
    headers: dict[str, str] | None = None


def refusal(request: web.Request, token: str, *, loopback_listener: bool, page: bool, public: bool) -> Refusal | None:
    """The refusal of ``request``, or None when it may reach its handler.

    ``page``: the request is for the status page's HTML; ``public``: its route needs no token
    (the browser checks still apply)."""
    refused = guard.refusal(request, loopback_listener=loopback_listener, page=page)
    if refused is not None:
        return Refusal(*refused)
    if public:
        return None
    problem = token_problem(request, token)
    if problem is not None:
        return Refusal(401, problem, CHALLENGE)
    return None


def token_problem(request: web.Request, token: str) -> str | None:
    """What is wrong with the request's ``Authorization`` header for ``token``; None: it is right."""
    values = request.headers.getall("Authorization", ())
    if not values:
        return "this call needs the admin token (Authorization: Bearer <token>)"
    value = values[0]
    # Non-UTF-8 bytes arrive as surrogate escapes: not ASCII, so refused here, never encoded.
    if len(values) > 1 or not value.isascii() or not value.isprintable():
        return "malformed Authorization header"
    scheme, _, given = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return "malformed Authorization header: expected Bearer <token>"
    if not hmac.compare_digest(given.strip().encode("ascii"), token.encode("utf-8")):
        return "wrong admin token"
    return None
