"""``location`` blocks to routes: nesting flattened, each route with the settings it inherits.

A location becomes a route when it proxies (``proxy_pass``) or answers (``return``);
nested locations become routes of their own, after their parent, as nginx's
inheritance (``Scope``) gives them their settings.
"""

from __future__ import annotations

from gateway.nginxconf import headers
from gateway.nginxconf.context import Context
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Doc, Route, Server
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.values import ROUTE_DURATIONS, ROUTE_ON_OFF, ROUTE_SIZES, location_text, unsupported


def location(
    ctx: Context,
    d: Directive,
    scope: Scope,
    server: Server,
    parent: tuple[str, str] | None,
    seen: dict[tuple[str, str], str],
) -> None:
    """``d`` and its nested locations as routes of ``server``; ``seen``: (kind, path) -> where, for duplicates."""
    assert d.block is not None
    spec = location_text(d.args)
    if spec is None:
        ctx.skip(d, "named (@) locations and locations without a path are not supported")
        return
    modifier, path = spec
    ident = ("regex" if modifier in ("~", "~*") else "prefix" if modifier in ("", "^~") else modifier, path)
    if parent is not None and parent[0] == "prefix" and ident[0] != "regex" and not path.startswith(parent[1]):
        ctx.skip(d, f'nginx: location "{path}" is outside location "{parent[1]}"')
        return
    if parent is not None and ident[0] == "regex" and parent[0] == "prefix":
        ctx.result.note(
            f"{d.where}: nested regex location {modifier} {path}: nginx tries it only for URIs under "
            f"{parent[1]}; the flattened route is tried for every URI"
        )
    ctx.access.location_rules([x for x in d.block if x.name in ("allow", "deny")])
    proxy: Directive | None = None
    ret: Directive | None = None
    for x in d.block:
        if x.name in ("allow", "deny", "location") or ctx.setting(x, scope):
            continue
        if x.name == "proxy_pass":
            proxy = x
        elif x.name == "return":
            ret = x
        elif x.name in ("if", "limit_except"):
            ctx.skip(x, f'"{x.name}" blocks are not supported: the directives inside were not applied')
        elif not ctx.directive(x, level="location"):
            ctx.skip(x, unsupported(x))
    text = f"{modifier} {path}" if modifier else path
    if ident in seen:
        ctx.skip(d, f'duplicate location "{text}" (first at {seen[ident]})')
    else:
        seen[ident] = d.where
        route = _route(ctx, d, text, ident[0] == "regex", scope, proxy, ret)
        if route is not None:
            server.routes.append(route)
    for x in d.block:
        if x.name == "location":
            location(ctx, x, scope.child(), server, ident, seen)


def _route(
    ctx: Context,
    d: Directive,
    text: str,
    regex: bool,
    scope: Scope,
    proxy: Directive | None,
    ret: Directive | None,
) -> Route | None:
    route = Route(data={"location": text})
    target: Doc = {}  # "return" or "uri", written after the settings
    if ret is not None:
        value = headers.return_target(ctx.result, ret)
        if value is not None:
            target["return"] = value
        if proxy is not None:
            ctx.skip(proxy, "proxy_pass after return is never reached in nginx")
    elif proxy is not None:
        uri = ctx.upstreams.proxy_pass(proxy, route, regex=regex)
        if uri is not None:
            target["uri"] = uri
    if "upstream" not in route.data and not target:
        ctx.skip(d, "no proxy_pass here: nginx serves it itself (root, static files); the gateway only proxies")
        return None
    _settings(route, scope)
    ctx.limits.for_route(route, scope)
    if "upstream" in route.data:
        ctx.upstreams.for_route(route.data["upstream"], scope)
    route.data.update(target)
    headers.route_headers(ctx.result, route, scope)
    return route


def _settings(route: Route, scope: Scope) -> None:
    """The route-level settings that pass through: body size and timeout, buffering."""
    data = route.data
    for name, key in (*ROUTE_DURATIONS.items(), *ROUTE_SIZES.items()):
        found = scope.get(name)
        if found is not None:
            data[key] = found.args[0]
    for name, key in ROUTE_ON_OFF.items():
        found = scope.get(name)
        if found is not None:
            data[key] = found.args[0] == "on"
    buffers = scope.get("proxy_buffers")
    if buffers is not None:
        data["proxy_buffers"] = " ".join(buffers.args)
