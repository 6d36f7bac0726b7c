"""``location`` blocks to routes: nesting flattened, each route with the settings it inherits.

A location becomes a route when it proxies (``proxy_pass``), answers (``return``), or hands
every request to a named location that proxies (``try_files ... @app``). Nested locations
become routes of their own, after their parent, as nginx's inheritance (``Scope``) gives
them their settings.

What cannot be translated fails closed: a route whose guard (``if (...) { return 403; }``,
``allow``/``deny``), ``return`` or ``proxy_pass`` was not translated refuses every request
(``guards``), unless the import runs with ``--allow-open``; either way the listing says which
requests would otherwise reach the backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.nginxconf import guards, headers
from gateway.nginxconf.access import rule_key
from gateway.nginxconf.context import Context
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Doc, Route, Server
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.values import ROUTE_DURATIONS, ROUTE_ON_OFF, ROUTE_SIZES, location_text

ACCESS = "allow/deny"  # the scope's array of a location's allow and deny rules, inherited whole
NON_HTTP_CONTENT = ("fastcgi_pass", "uwsgi_pass", "scgi_pass", "grpc_pass", "memcached_pass")
TRY_FILES_NOTE = (
    "try_files ... @name: the gateway has no files to try, so every request goes to the named location's upstream"
)


@dataclass(slots=True)
class Site:
    """One server block's state while its locations become routes."""

    server: Server
    scope: Scope  # the server level's
    named: dict[str, Directive] = field(default_factory=dict)  # "@app" -> its location block
    used: set[str] = field(default_factory=set)  # the named locations a try_files reached
    seen: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, path) -> where, for duplicates
    refusals: list[str] = field(default_factory=list)  # the server level's untranslated guards
    # where a regex nested in a prefix location goes: before the server's own regexes, which nginx
    # tries only after the nested ones of the longest matching prefix (None: no server regex yet)
    nested_regex_at: int | None = None
    access: list[Directive] = field(default_factory=list)  # the allow/deny list in force at server level


@dataclass(slots=True)
class Body:
    """What one location block says about its route (settings go into the scope)."""

    proxy: Directive | None = None
    ret: Directive | None = None
    try_files: Directive | None = None
    refusals: list[str] = field(default_factory=list)
    internal: Directive | None = None
    rules: list[Doc] = field(default_factory=list)  # its if-return guards, in order (before the limits)


def location(ctx: Context, d: Directive, scope: Scope, site: Site, parent: tuple[str, str] | None) -> None:
    """``d`` and its nested locations as routes of the site's server."""
    assert d.block is not None
    spec = location_text(d.args)
    if spec is None:
        if not (len(d.args) == 1 and d.args[0].startswith("@")):
            ctx.skip(d, "a location without a path")
        return  # named locations are reached through try_files (see named_left)
    modifier, path = spec
    ident = ("regex" if modifier in ("~", "~*") else "prefix" if modifier in ("", "^~") else modifier, path)
    if parent is not None and parent[0] == "prefix" and ident[0] != "regex" and not path.startswith(parent[1]):
        ctx.skip(d, f'nginx: location "{path}" is outside location "{parent[1]}"')
        return
    nested_regex = parent is not None and ident[0] == "regex" and parent[0] == "prefix"
    if nested_regex and parent is not None:
        ctx.result.note(
            f"{d.where}: nested regex location {modifier} {path}: nginx tries it only for URIs under "
            f"{parent[1]}; the flattened route is tried for every URI, before the server's own regexes"
        )
    body = read_body(ctx, d.block, scope)
    text = f"{modifier} {path}" if modifier else path
    if ident in site.seen:
        ctx.skip(d, f'duplicate location "{text}" (first at {site.seen[ident]})')
    else:
        site.seen[ident] = d.where
        route = _route(ctx, d, text, ident[0] == "regex", scope, body, site)
        if route is not None:
            _add(site, route, nested_regex, top_regex=ident[0] == "regex" and parent is None)
    for x in d.block:
        if x.name == "location" and x.block is not None:
            location(ctx, x, scope.child(), site, ident)


def _add(site: Site, route: Route, nested_regex: bool, top_regex: bool) -> None:
    """Append ``route``; a nested regex goes before the server-level regexes (nginx's order under its prefix)."""
    routes = site.server.routes
    if nested_regex and site.nested_regex_at is not None:
        routes.insert(site.nested_regex_at, route)
        site.nested_regex_at += 1
        return
    if top_regex and site.nested_regex_at is None:
        site.nested_regex_at = len(routes)
    routes.append(route)


def read_body(ctx: Context, block: list[Directive], scope: Scope) -> Body:
    """The block's settings into ``scope``; its proxy_pass, return, try_files and guards into a ``Body``."""
    body = Body()
    rules = [x for x in block if x.name in ("allow", "deny")]
    if rules:
        scope.arrays[ACCESS] = rules  # replaces the parent location's list, as in nginx; else inherited
    for x in block:
        if x.name in ("allow", "deny", "location") or ctx.setting(x, scope):
            continue
        if x.name == "proxy_pass":
            body.proxy = x
        elif x.name == "return":
            body.ret = body.ret or x
        elif x.name == "try_files":
            body.try_files = x
        elif x.name == "internal" and not x.args:
            body.internal = x
        elif x.name == "if" and x.block is not None and body.ret is not None:
            ctx.skip(x, f"never reached: the return at {body.ret.where} answers first")
        elif x.name == "if" and x.block is not None:
            body.refusals += guards.guard(ctx, x, body.rules, block)
        elif x.name == "limit_except" and x.block is not None:
            body.refusals += guards.limit_except(ctx, x)
        elif not ctx.directive(x, level="location"):
            ctx.unsupported(x)
    return body


def _route(ctx: Context, d: Directive, text: str, regex: bool, scope: Scope, body: Body, site: Site) -> Route | None:
    route = Route(data={"location": text})
    if body.rules:
        route.data["rules"] = body.rules
    refusals = [*site.refusals, *_guards(ctx, scope, body)]
    access = [scope.array(ACCESS)]  # its own or an outer location's; [] for the server's
    if body.internal is not None:  # only nginx's own redirects reach it; a client gets 404
        route.data.pop("rules", None)
        route.data["return"] = {"code": 404}
        route.comments.append(f"internal ({body.internal.where}): nginx answers 404 to clients here")
        return route
    if body.ret is not None:
        if body.proxy is not None:
            ctx.skip(body.proxy, "proxy_pass after return is never reached in nginx")
        value = headers.return_target(ctx.result, body.ret, site.server)
        if value is None and ctx.allow_open:
            ctx.skip(
                d, f"--allow-open: its return ({body.ret.where}) was not translated; other routes serve these URIs"
            )
            return None
        if value is None:
            return _refuse(route, [f"its return ({body.ret.where}) was not translated"], backend=False)
        route.data["return"] = value  # a guard not translated lets nothing through to a backend here
        headers.route_headers(ctx.result, route, scope)
        return route
    if body.proxy is None and body.try_files is not None:
        target = _named_target(ctx, body.try_files, site)
        if target is not None:
            named_scope = site.scope.child()
            named_body = read_body(ctx, target.block or [], named_scope)
            _limits_once(named_scope, scope)
            if named_body.proxy is not None:
                ctx.result.note(TRY_FILES_NOTE)
                refusals += _guards(ctx, named_scope, named_body)
                access.append(named_scope.array(ACCESS))  # nginx checks both: the redirect runs it again
                if named_body.rules:
                    route.data["rules"] = body.rules + named_body.rules
                    ctx.result.note(
                        f"{target.where}: the named location's if-return rules run before the limits of "
                        "the location whose try_files reaches it (nginx: after them)"
                    )
                body, scope = named_body, named_scope
    if body.proxy is None and any(_denies_all(rules or site.access) for rules in access):
        route.data["return"] = {"code": 403}  # nginx checks the list before it serves files: 403 to all
        return route
    if body.proxy is None:
        blocks = [d.block or [], *(t.block or [] for t in [_peek_named(body.try_files, site)] if t is not None)]
        names = {x.name for block in blocks for x in block}
        if names & set(NON_HTTP_CONTENT):
            ctx.result.non_http = True
            why = "nginx serves it by FastCGI/uwsgi/gRPC; the gateway proxies HTTP only"
        elif "rewrite" in names:
            why = "nginx rewrites the URI and serves it from another location; the gateway rewrites no URIs"
        else:
            why = "nginx serves it itself (root, static files); the gateway only proxies"
        ctx.skip(d, f"no proxy_pass here: {why}")
        return None
    uri = ctx.upstreams.proxy_pass(body.proxy, route, regex=regex)
    if "upstream" not in route.data:
        return _refuse(route, [f"its proxy_pass ({body.proxy.where}) was not translated"], backend=False)
    refusals += _access(ctx, route, access, site)
    if refusals and not ctx.allow_open:
        return _refuse(route, refusals)
    _settings(route, scope)
    ctx.limits.for_route(route, scope)
    ctx.upstreams.for_route(route.data["upstream"], scope)
    if uri is not None:
        route.data["uri"] = uri
    headers.route_headers(ctx.result, route, scope)
    return route


def _guards(ctx: Context, scope: Scope, body: Body) -> list[str]:
    """The guards of the block and the auth in force that are not translated (refusals)."""
    return [*body.refusals, *guards.auth(ctx, scope)]


def _access(ctx: Context, route: Route, lists: list[list[Directive]], site: Site) -> list[str]:
    """The route's own ``access:`` when a location's allow/deny list is in force (the refusals when
    it cannot be). ``lists``: the location's (and the named location's a try_files reaches),
    each [] when that location has none and the server's applies."""
    in_force = {rule_key(rules or site.access): rules or site.access for rules in lists if rules or site.access}
    if not in_force:
        return []
    if len(in_force) > 1:  # a request must pass both: no one first-match list says that
        every = [r for rules in in_force.values() for r in rules]
        return guards.location_rules(ctx, every)
    rules = next(iter(in_force.values()))
    if rules is site.access or rule_key(rules) == rule_key(site.access):
        return []  # the server's (or the http level's): inherited as it is
    translated = ctx.access.translate(rules)
    if translated is None:
        return guards.location_rules(ctx, rules)
    route.data["access"] = translated
    return []


def _denies_all(rules: list[Directive]) -> bool:
    """The list answers 403 to every client: a deny all before any allow."""
    for r in rules:
        if r.name == "allow":
            return False
        if r.args == ["all"]:
            return True
    return False


def _refuse(route: Route, reasons: list[str], backend: bool = True) -> Route:
    """The route answers 403 (a guard not translated) or 503 (its answer not translated) to every request."""
    route.data.pop("upstream", None)
    code = 403 if backend else 503
    route.data["return"] = {"code": code}
    route.comments += [f"refuses every request ({code}): {reason}" for reason in reasons]
    return route


def _named_target(ctx: Context, d: Directive, site: Site) -> Directive | None:
    last = d.args[-1] if d.args else ""
    if not last.startswith("@"):
        return None
    target = site.named.get(last)
    if target is None:
        ctx.skip(d, f'nginx: no location "{last}" in this server')
        return None
    site.used.add(last)
    return target


def _peek_named(d: Directive | None, site: Site) -> Directive | None:
    last = d.args[-1] if d is not None and d.args else ""
    return site.named.get(last) if last.startswith("@") else None


def _limits_once(named: Scope, first: Scope) -> None:
    """nginx runs limit_req and limit_conn once per request: when the location holding try_files
    has them (its own or inherited), the named location's are not applied."""
    for name in ("limit_req", "limit_conn"):
        if first.array(name):
            named.arrays[name] = list(first.array(name))


def named_left(ctx: Context, site: Site) -> None:
    for name, d in site.named.items():
        if name not in site.used:
            ctx.skip(d, "a named location no try_files here reaches (error_page and X-Accel-Redirect are not followed)")


def _settings(route: Route, scope: Scope) -> None:
    """The route-level settings that pass through: body size and timeout, buffering."""
    data: Doc = route.data
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
