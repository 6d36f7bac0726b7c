"""``server`` blocks: ``listen``, ``server_name``, the server's TLS keys, guards and access rules, then its locations.

A server-level ``return`` answers every request before any location (nginx's server
rewrite phase): it becomes the server's one route, ``/``. A server-level ``try_files ...
@app`` serves the URIs no location matches: a ``/`` route to ``@app``'s upstream.
"""

from __future__ import annotations

from gateway.config.servers import parse_server_name
from gateway.nginxconf import guards, headers
from gateway.nginxconf.context import Context
from gateway.nginxconf.locations import Site, location, named_left
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Route, Server
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.tls import SSL_DIRECTIVES, ssl

HTTP2_NOTE = "http2: served as HTTP/1.1 (clients fall back to it through ALPN)"
# listen parameters that tune the socket or the protocol: accepted, with nothing to do here
LISTEN_NO_OPS = ("deferred", "ipv6only", "reuseport", "backlog", "so_keepalive", "fastopen", "rcvbuf", "sndbuf",
                 "accept_filter", "setfib", "bind", "http2")  # fmt: skip


def server(ctx: Context, d: Directive, block: list[Directive], scope: Scope, single: bool) -> None:
    """One server block; ``single``: the only one (its global directives apply to all)."""
    result = ctx.result
    ctx.error_pages = error_page_codes(block, dict(ctx.http_error_pages))
    ctx.assigned = guards.assigned(block)  # the server's sets: a location's if may read them
    srv = Server(where=d.where)
    site = Site(server=srv, scope=scope, access=ctx.access.http_rules)
    rules = [x for x in block if x.name in ("allow", "deny")]
    if rules:  # its own list: the http level's is not inherited
        site.access = rules
        srv.access = ctx.access.translate(rules)
        if srv.access is None:
            site.refusals += guards.location_rules(ctx, rules)
    else:
        site.refusals += ctx.http_refusals
    ret = next((x for x in block if x.name == "return"), None)
    try_files: Directive | None = None
    answered = False  # the server's return came before: nginx's rewrite phase stops there
    for x in block:
        answered = answered or x is ret
        if x.name in ("allow", "deny") or ctx.setting(x, scope):
            continue
        if x.name == "location":
            if x.args[:1] and x.args[0].startswith("@") and x.block is not None:
                site.named.setdefault(x.args[0], x)
        elif x.name == "listen":
            listen(ctx, x, srv)
        elif x.name == "server_name":
            srv.names.extend(server_names(ctx, x))
        elif x.name in SSL_DIRECTIVES:
            ssl(result, x, srv.tls)
        elif x.name == "return":
            if x is not ret:
                ctx.skip(x, f"never reached: the return at {ret.where if ret else '?'} answers first")
        elif x.name == "try_files":
            try_files = x
        elif x.name == "if" and x.block is not None and ret is not None:
            _before_return(ctx, x, ret, answered, srv, block)
        elif x.name == "if" and x.block is not None:
            site.refusals += guards.guard(ctx, x, srv.rules, block)
        elif x.name == "http2" and x.args == ["on"]:
            result.note(HTTP2_NOTE)
        elif not ctx.directive(x, level="server", single=single, server=d.where):
            ctx.unsupported(x)
    if not any(x.name == "listen" for x in block):
        srv.listen.append("0.0.0.0:80")  # nginx's default (as root)
    elif not srv.listen:
        ctx.skip(d, "no listen address the gateway can serve (see the listen lines): server left out")
        return
    if ret is not None:
        _server_return(ctx, ret, block, site)
    else:
        for x in block:
            if x.name == "location" and x.block is not None:
                location(ctx, x, scope.child(), site, None)
        if try_files is not None and ("prefix", "/") not in site.seen:
            _server_try_files(ctx, try_files, site)
        named_left(ctx, site)
    result.servers.append(srv)


def error_page_codes(block: list[Directive], codes: dict[str, Directive] | None = None) -> dict[str, Directive]:
    """The codes the ``error_page`` lines of ``block`` and its nested blocks list (the target
    aside), added to ``codes``: code -> the line, one that hands the request on kept first."""
    codes = {} if codes is None else codes
    for x in block:
        if x.block is not None and x.name != "server":
            error_page_codes(x.block, codes)
        for code in x.args[:-1] if x.name == "error_page" else []:
            if code.isdigit() and (code not in codes or (guards.hands_on(x) and not guards.hands_on(codes[code]))):
                codes[code] = x
    return codes


def _before_return(
    ctx: Context, x: Directive, ret: Directive, answered: bool, srv: Server, block: list[Directive]
) -> None:
    """An ``if`` of a server that ends in a ``return``: a rule when written before it and translated."""
    if answered:
        ctx.skip(x, f"never reached: the server's return at {ret.where} answers first")
        return
    translated, why = guards.rule(ctx, x, block)
    if translated is not None:
        srv.rules.append(translated)
        return
    ctx.skip(x, f"not translated ({why}): requests matching {guards.condition(x)[3:]} get the server's return "
             f"({ret.where}) instead of what this if answers")  # fmt: skip


def _server_return(ctx: Context, ret: Directive, block: list[Directive], site: Site) -> None:
    """A server-level return answers every request first: one route ``/``; the locations are never reached."""
    route = Route(data={"location": "/"})
    value = headers.return_target(ctx.result, ret, site.server)
    if value is None:
        route.data["return"] = {"code": 503}
        route.comments.append(f"refuses every request (503): the server's return ({ret.where}) was not translated")
    else:
        route.data["return"] = value
    site.server.routes.append(route)
    for x in block:
        if x.name == "location":
            ctx.skip(x, f"never reached: the server-level return ({ret.where}) answers every request first")


def _server_try_files(ctx: Context, d: Directive, site: Site) -> None:
    """``try_files ... @app`` at server level: the URIs no location matches go to ``@app``."""
    if d.args[-1:] and d.args[-1].startswith("@"):
        location(ctx, Directive("location", ["/"], d.file, d.line, [d]), site.scope.child(), site, None)
    else:
        ctx.skip(d, "try_files without a named location: nginx serves files; the gateway only proxies")


def listen(ctx: Context, d: Directive, srv: Server) -> None:
    if not d.args:
        ctx.skip(d, "listen needs an address")
        return
    address, params = d.args[0], d.args[1:]
    names = [p.split("=")[0] for p in params]
    if address.startswith("unix:"):
        ctx.skip(d, "the gateway listens on TCP only (no unix: sockets)")
        return
    if "quic" in names:
        ctx.skip(d, "QUIC (HTTP/3) listens on UDP: terminate it in front of the gateway; this listen is left out")
        return
    bad = [
        p
        for p, n in zip(params, names, strict=True)
        if n not in ("default_server", "default", "ssl", "proxy_protocol", *LISTEN_NO_OPS)
    ]
    if bad:
        ctx.skip(d, f"listen parameters {' '.join(bad)} are not supported: this listen is left out")
        return
    if address.isdigit():
        address = f"0.0.0.0:{address}"
    elif address.startswith("*:"):
        address = "0.0.0.0:" + address[2:]
    elif ":" not in address.replace("[::]", "").rsplit("]", 1)[-1]:
        address = f"{address}:80"
    flags = [p for p in ("ssl", "proxy_protocol") if p in params]
    entry = " ".join([address, *flags])
    if entry not in srv.listen:
        srv.listen.append(entry)
    if "default_server" in params or "default" in params:
        srv.default = True
    if "http2" in names:
        ctx.result.note(HTTP2_NOTE)
    ctx.result.listen_no_ops.update(n for n in names if n in LISTEN_NO_OPS and n != "http2")


def server_names(ctx: Context, d: Directive) -> list[str]:
    names = []
    for name in d.args:
        if name in ("", "_"):
            continue  # nginx's catch-all spellings: names nothing, the default server catches all
        try:
            parse_server_name(name)
        except ValueError as exc:
            ctx.skip(d, f"server_name: {exc}")
            continue
        names.append(name)
    return names
