"""nginx directives (a parsed tree) to a gateway configuration: the main and http levels.

The coordinator: it walks the main and http contexts and hands each directive to its
family, ``variables`` (map and geo, read first), ``servers`` (server blocks, which hand on to
``locations``), ``tls``, ``edge``,
or, for those valid at several levels, ``Context.directive`` (zones in ``limits``,
``upstreams``, ``logs``, ``access``). What is not translated is skipped with a reason.
"""

from __future__ import annotations

from gateway.nginxconf import edge, guards, runs
from gateway.nginxconf.context import Context
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Result
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.servers import HTTP2_NOTE, error_page_codes, server
from gateway.nginxconf.tls import SSL_DIRECTIVES, ssl

HTTP_LIKE = ("server", "upstream", "limit_req_zone", "limit_conn_zone", "location", "map", "geo")


def translate(directives: list[Directive], allow_open: bool = False) -> Result:
    """The whole configuration (or an http-level fragment such as conf.d/site.conf).

    ``allow_open``: a guard that is not translated leaves its route proxying (listed) instead
    of making it refuse every request."""
    ctx = Context(allow_open=allow_open)
    if not any(d.name == "http" for d in directives) and any(d.name in HTTP_LIKE for d in directives):
        _http(ctx, directives, Scope())
    else:
        _main(ctx, directives)
    result = ctx.finish()
    runs.finish(result, directives)
    written = [result.doc, [s.rules for s in result.servers], [r.data for s in result.servers for r in s.routes]]
    ctx.variables.finish(result.doc, written)
    return result


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
        elif d.name in ("user", "pid", "worker_rlimit_nofile", "pcre_jit", "load_module", "include", "daemon",
                        "master_process", "worker_cpu_affinity", "worker_priority", "timer_resolution", "env",
                        "thread_pool", "worker_shutdown_timeout", "lock_file", "ssl_engine"):  # fmt: skip
            ctx.result.same_here(d)  # the process's own business: the gateway runs as it is started
        else:
            ctx.skip(d, "a main-context directive the gateway has no use for")


def _http(ctx: Context, block: list[Directive], scope: Scope) -> None:
    ctx.variables.read(block)  # first: every later key and value may use their variables
    ctx.http_error_pages = error_page_codes([d for d in block if d.name == "error_page"])
    servers = [d for d in block if d.name == "server" and d.block is not None]
    rules = [d for d in block if d.name in ("allow", "deny")]
    if rules:
        ctx.access.http = ctx.access.translate(rules)
        ctx.access.http_rules = rules
        if ctx.access.http is None:
            ctx.http_refusals = guards.location_rules(ctx, rules)
    for d in block:
        if d.name in ("server", "location", "allow", "deny", "map", "geo") or ctx.setting(d, scope):
            continue
        if d.name in SSL_DIRECTIVES:
            ssl(ctx.result, d, ctx.result.doc)
        elif d.name == "http2" and d.args == ["on"]:
            ctx.result.note(HTTP2_NOTE)
        elif not ctx.directive(d, level="http"):
            ctx.unsupported(d)
    for d in block:
        if d.name == "location":
            ctx.skip(d, 'nginx: "location" is not allowed here (http level)')
    for d in servers:
        assert d.block is not None
        server(ctx, d, d.block, scope.child(), single=len(servers) == 1)
