"""nginx's ``add_header``: response headers added by a route, compiled once.

A header is added (never replacing one of the upstream's) when the status is one of
200, 201, 204, 206, 301, 302, 303, 304, 307, 308, or on any status when ``always``.
This holds for proxied responses and for the gateway's own (errors, rejections,
redirects, ``return``), as in nginx.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from multidict import CIMultiDict

from gateway.http.templates import ValueFn

if TYPE_CHECKING:
    from gateway.http.context import RequestContext

ADD_HEADER_STATUSES = frozenset({200, 201, 204, 206, 301, 302, 303, 304, 307, 308})


@dataclass(frozen=True, slots=True)
class AddedHeader:
    name: str
    value: ValueFn
    always: bool


def add_headers(headers: CIMultiDict[str], added: tuple[AddedHeader, ...], status: int, ctx: RequestContext) -> None:
    """Add the route's headers that apply to ``status``; an empty value adds nothing (nginx)."""
    listed = status in ADD_HEADER_STATUSES
    for header in added:
        if listed or header.always:
            value = header.value(ctx)
            if value:
                headers.add(header.name, value)
