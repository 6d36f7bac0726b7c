"""``server`` blocks: ``listen``, ``server_name``, the server's TLS keys and access rules, then its locations."""

from __future__ import annotations

from gateway.config.servers import parse_server_name
from gateway.nginxconf.context import Context
from gateway.nginxconf.locations import location
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Server
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.tls import SSL_DIRECTIVES, ssl
from gateway.nginxconf.values import unsupported


def server(ctx: Context, d: Directive, block: list[Directive], scope: Scope, single: bool) -> None:
    """One server block; ``single``: the only one (its global directives apply to all)."""
    result = ctx.result
    srv = Server(where=d.where)
    rules = [x for x in block if x.name in ("allow", "deny")]
    if rules:
        ctx.access.rules(rules, global_ok=single)
    for x in block:
        if x.name in ("allow", "deny", "location") or ctx.setting(x, scope):
            continue
        if x.name == "listen":
            listen(ctx, x, srv)
        elif x.name == "server_name":
            srv.names.extend(server_names(ctx, x))
        elif x.name in SSL_DIRECTIVES:
            ssl(result, x, srv.tls)
        elif x.name == "return":
            ctx.skip(x, "a server-level return: write it as a location / with return")
        elif not ctx.directive(x, level="server", single=single):
            ctx.skip(x, unsupported(x))
    if not any(x.name == "listen" for x in block):
        srv.listen.append("0.0.0.0:80")  # nginx's default (as root)
    elif not srv.listen:
        ctx.skip(d, "no listen address the gateway can serve (see the listen lines): server left out")
        return
    seen: dict[tuple[str, str], str] = {}
    for x in block:
        if x.name == "location":
            location(ctx, x, scope.child(), srv, None, seen)
    result.servers.append(srv)


def listen(ctx: Context, d: Directive, srv: Server) -> None:
    if not d.args:
        ctx.skip(d, "listen needs an address")
        return
    address, params = d.args[0], d.args[1:]
    known = ("default_server", "default", "reuseport", "backlog", "ssl", "proxy_protocol")
    bad = [p for p in params if p.split("=")[0] not in known]
    if address.startswith("unix:"):
        ctx.skip(d, "the gateway listens on TCP only (no unix: sockets)")
        return
    if bad:
        ctx.skip(d, f"listen parameters {' '.join(bad)} are not supported (no HTTP2/QUIC/PROXY protocol)")
        return
    if address.isdigit():
        address = f"0.0.0.0:{address}"
    elif address.startswith("*:"):
        address = "0.0.0.0:" + address[2:]
    elif ":" not in address.replace("[::]", "").rsplit("]", 1)[-1]:
        address = f"{address}:80"
    flags = [p for p in ("ssl", "proxy_protocol") if p in params]
    srv.listen.append(" ".join([address, *flags]))
    if "default_server" in params or "default" in params:
        srv.default = True
    extra = [p for p in params if p.split("=")[0] in ("reuseport", "backlog")]
    if extra:
        ctx.result.note(f"{d.where}: listen {' '.join(extra)}: not needed (the gateway sets SO_REUSEPORT itself)")


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
