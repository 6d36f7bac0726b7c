"""Short responses the gateway produces itself (errors, rejections, redirects).

The body is plain text, or JSON when the client's ``Accept`` prefers it.
"""

from __future__ import annotations

import json
from http import HTTPStatus

from aiohttp import web
from multidict import CIMultiDict


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def prefers_json(accept: str) -> bool:
    """True when ``Accept`` ranks a JSON type above text/plain and text/html."""
    if not accept or "json" not in accept:
        return False
    best_json = 0.0
    best_text = 0.0
    for item in accept.split(","):
        media, _, params = item.strip().partition(";")
        media = media.strip().lower()
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media == "application/json" or media.endswith("+json"):
            best_json = max(best_json, q)
        elif media in ("text/plain", "text/html", "text/*", "*/*"):
            best_text = max(best_text, q - (0.001 if media in ("*/*", "text/*") else 0))
    return best_json > 0 and best_json >= best_text


def error(
    status: int,
    accept: str,
    message: str | None = None,
    *,
    headers: CIMultiDict[str] | None = None,
    extra: dict[str, object] | None = None,
) -> web.Response:
    reason = _reason(status)
    text = message or reason.lower()
    if prefers_json(accept):
        payload: dict[str, object] = {"status": status, "error": text}
        if extra:
            payload.update(extra)
        body = json.dumps(payload, separators=(",", ":")) + "\n"
        content_type = "application/json"
    else:
        body = f"{status} {reason}: {text}\n"
        content_type = "text/plain"
    response = web.Response(status=status, reason=reason, text=body, content_type=content_type, headers=headers)
    return response


def redirect(location: str) -> web.Response:
    return web.Response(
        status=301,
        headers={"Location": location},
        text="301 Moved Permanently\n",
        content_type="text/plain",
    )
