"""The admin API's JSON replies: one shape (indented, newline-terminated) for every call."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web


def json_reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """``body`` as an ``application/json`` response."""
    return web.Response(
        text=json.dumps(body, indent=1) + "\n", status=status, content_type="application/json", headers=headers
    )
