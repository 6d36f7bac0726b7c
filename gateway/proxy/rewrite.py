"""``proxy_pass`` with a URI part: the matched location prefix replaced, as nginx does.

With ``location /api/`` and ``uri: /v1/``, ``/api/users?x=1`` goes upstream as
``/v1/users?x=1``. As in nginx (``ngx_http_proxy_create_request``), the rest of the
*normalised* URI (``$uri``: decoded, slashes merged, dot segments resolved) follows
the replacement. When the client's path had percent-escapes, that rest is escaped
again with nginx's ``NGX_ESCAPE_URI`` set: bytes 00-1F, space, ``#``, ``%``, ``?`` and
7F-FF become ``%XX`` (upper-case hex); every other byte goes as it is (so ``%2F``
from the client reaches the upstream as ``/``, as with nginx). Without escapes in
the client's path, the rest is sent as normalised. The query string (``$args``)
follows unchanged. An exact location replaces the whole URI.

Without ``uri`` (``forwarded_target``), the client's target goes as it came when its path
is already ``$uri``, and ``$uri`` escaped the same way otherwise: the upstream resolves
the path the gateway routed on, never another (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.http.context import RequestContext
from gateway.proxy.headers import SetFields

_ESCAPED = frozenset(range(0x00, 0x21)) | frozenset(b"#%?") | frozenset(range(0x7F, 0x100))
_TABLE = tuple(f"%{b:02X}" if b in _ESCAPED else chr(b) for b in range(256))


def escape_uri(text: str) -> str:
    """nginx's ``ngx_escape_uri(..., NGX_ESCAPE_URI)`` over the bytes of ``text``."""
    data = text.encode("utf-8", "surrogateescape")
    return "".join([_TABLE[b] for b in data])


def forwarded_target(ctx: RequestContext) -> str:
    """The request target for the upstream of a route without ``uri``: the client's own when
    its path is ``$uri`` already; otherwise ``$uri`` escaped again (as nginx sends it when
    ``proxy_pass`` has a URI) and the query as it came. So the upstream never receives dot
    segments, merged slashes or escaped separators (``/public/..%2fadmin``, ``//admin``,
    ``%2e%2e``) that it could resolve to another path than the one the gateway routed on."""
    raw = ctx.raw_target
    uri = ctx.uri
    size = len(uri)
    if raw.startswith(uri) and (len(raw) == size or raw[size] == "?"):
        return raw
    query_at = raw.find("?")
    return escape_uri(uri) + raw[query_at:] if query_at >= 0 else escape_uri(uri)


def upstream_target(ctx: RequestContext, prefix_len: int, replacement: str) -> str:
    """The request target for the upstream: ``replacement`` + the rest of ``$uri`` + ``?args``."""
    rest = ctx.uri[prefix_len:]
    if "%" in ctx.path_only:
        rest = escape_uri(rest)
    query = ctx.raw_query
    return f"{replacement}{rest}?{query}" if query else replacement + rest


@dataclass(frozen=True, slots=True)
class UpstreamRewrite:
    """A route's changes to the request it forwards: ``uri`` and ``proxy_set_header``."""

    uri: str | None
    uri_cut: int  # the length of the location's prefix, replaced by ``uri``
    set_fields: Callable[[RequestContext], SetFields] | None

    def apply(self, ctx: RequestContext) -> tuple[str, SetFields | None]:
        target = upstream_target(ctx, self.uri_cut, self.uri) if self.uri is not None else forwarded_target(ctx)
        return target, self.set_fields(ctx) if self.set_fields is not None else None
