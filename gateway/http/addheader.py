"""nginx's ``add_header``: response headers added by a route, compiled once.

A header applies when the status is one of 200, 201, 204, 206, 301, 302, 303, 304, 307,
308, or on any status when ``always``. Most headers are added beside the upstream's (an
empty value adds nothing); ``Cache-Control`` and ``Link`` too, appended to the list.
``ETag`` and ``Last-Modified`` **replace** the response's own, and an empty value removes
them, as nginx's headers filter does. This holds for proxied responses and for the
gateway's own (errors, rejections, redirects, ``return``), as in nginx.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from multidict import CIMultiDict

from gateway.http.templates import ValueFn

if TYPE_CHECKING:
    from gateway.http.context import RequestContext

ADD_HEADER_STATUSES = frozenset({200, 201, 204, 206, 301, 302, 303, 304, 307, 308})
REPLACED = frozenset({"etag", "last-modified"})  # nginx: set, not added; empty: removed


@dataclass(frozen=True, slots=True)
class AddedHeader:
    name: str
    value: ValueFn
    always: bool
    replaces: bool = field(init=False)  # ETag, Last-Modified

    def __post_init__(self) -> None:
        object.__setattr__(self, "replaces", self.name.lower() in REPLACED)


def add_headers(headers: CIMultiDict[str], added: tuple[AddedHeader, ...], status: int, ctx: RequestContext) -> None:
    """Add the route's headers that apply to ``status``; an empty value adds nothing (nginx),
    except for ``ETag`` and ``Last-Modified``: those replace, and an empty value removes."""
    listed = status in ADD_HEADER_STATUSES
    for header in added:
        if listed or header.always:
            value = header.value(ctx)
            if header.replaces:
                if value:
                    headers[header.name] = value
                else:
                    headers.popall(header.name, None)
            elif value:
                headers.add(header.name, value)
