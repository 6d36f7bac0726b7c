"""nginx directives (a parsed tree) to a gateway configuration: the main and http levels.

The coordinator: it walks the main and http contexts and hands each directive to its
family, ``servers`` (server blocks, which hand on to ``locations``), ``tls``, ``edge``,
or, for those valid at several levels, ``Context.directive`` (zones in ``limits``,
``upstreams``, ``logs``, ``access``). What is not translated is skipped with a reason.
"""

from __future__ import annotations

from gateway.nginxconf import edge
from gateway.nginxconf.context import Context
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Result
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.servers import server
from gateway.nginxconf.tls import SSL_DIRECTIVES, ssl
from gateway.nginxconf.values import unsupported

HTTP_LIKE = ("server", "upstream", "limit_req_zone", "limit_conn_zone", "location")


def translate(directives: list[Directive]) -> Result:
    """The whole configuration (or an http-level fragment such as conf.d/site.conf)."""
    ctx = Context()
    if not any(d.name == "http" for d in directives) and any(d.name in HTTP_LIKE for d in directives):
        _http(ctx, directives, Scope())
    else:
        _main(ctx, directives)
    return ctx.finish()


def _main(ctx: Context, directives: list[Directive]) -> None:
    for d in directives:
        if d.name == "http" and d.block is not None:
            _http(ctx, d.block, Scope())
        elif d.name == "events" and d.block is not None:
            edge.events(ctx.result, d.block)
        elif d.name == "worker_processes" and d.args:
            edge.worker_processes(ctx.result, d)
        elif d.name == "error_log":
            ctx.logs.error_log(d)
        else:
            ctx.skip(d, "a main-context directive the gateway has no use for")


def _http(ctx: Context, block: list[Directive], scope: Scope) -> None:
    servers = [d for d in block if d.name == "server" and d.block is not None]
    for d in block:
        if d.name in ("server", "location") or ctx.setting(d, scope):
            continue
        if d.name in SSL_DIRECTIVES:
            ssl(ctx.result, d, ctx.result.doc)
        elif not ctx.directive(d, level="http"):
            ctx.skip(d, unsupported(d))
    for d in block:
        if d.name == "location":
            ctx.skip(d, 'nginx: "location" is not allowed here (http level)')
    for d in servers:
        assert d.block is not None
        server(ctx, d, d.block, scope.child(), single=len(servers) == 1)
