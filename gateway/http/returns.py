"""``return`` routes: the gateway answers itself, as nginx's ``return`` does.

``{code: 301|302|303|307|308, url: ...}`` answers a redirect with ``Location``;
``{code: N, text: ...}`` answers the text (``text/plain``); ``{code: N}`` alone
answers the gateway's usual short body for that status (empty for 204).
The url and text may hold variables, rendered per request. Code 444 (``CLOSE``) answers
nothing: the connection is closed, as nginx does (the pipeline does it, see ``flow``).
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

from aiohttp import web

from gateway.http import responses
from gateway.http.context import RequestContext
from gateway.http.templates import ValueFn

CLOSE = 444  # nginx's NGX_HTTP_CLOSE: no response, the connection closed


@dataclass(frozen=True, slots=True, kw_only=True)
class ReturnPlan:
    code: int
    url: ValueFn | None
    text: ValueFn | None


def _reason(code: int) -> str:
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return "Unknown"


def answer_return(ret: ReturnPlan, ctx: RequestContext, accept: str) -> web.Response:
    code = ret.code
    if ret.url is not None:
        reason = _reason(code)
        return web.Response(
            status=code,
            reason=reason,
            headers={"Location": ret.url(ctx)},
            text=f"{code} {reason}\n",
            content_type="text/plain",
        )
    if ret.text is not None:
        return web.Response(status=code, reason=_reason(code), text=ret.text(ctx), content_type="text/plain")
    if code == 204 or code < 400:
        return web.Response(status=code, reason=_reason(code))
    return responses.error(code, accept)
