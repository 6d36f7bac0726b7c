"""Guards the gateway cannot express: ``if (...) { return 403; }``, ``limit_except``, ``allow``/``deny`` lists.

Leaving one out would let the requests it refuses reach the backend, so each is listed with
what it does in nginx and returned as a *refusal*: the route (or every route of the server)
then answers 403 to every request, unless the import runs with ``--allow-open``, where the
route proxies and the listing says which requests now reach the backend.

``auth_basic`` and ``auth_request`` are guards too: the gateway checks no credentials.

An ``if`` that only answers 1xx/2xx itself (a CORS preflight's ``return 204``), sets
variables or adds headers is no guard: it is listed as not translated, without refusing.
"""

from __future__ import annotations

from gateway.nginxconf.context import Context
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.values import AUTH


def condition(d: Directive) -> str:
    """``if`` and its condition as written (quotes kept), without the block."""
    return d.text().removesuffix(" { ... }")


def _refusal(ctx: Context, d: Directive, requests: str, nginx_does: str) -> list[str]:
    """Lists ``d``; a refusal reason unless ``--allow-open``."""
    if ctx.allow_open:
        ctx.skip(d, f"not translated (--allow-open): {requests} reach the backend; nginx {nginx_does} them")
        return []
    ctx.skip(
        d,
        f"not translated: the route refuses every request (403) instead; nginx {nginx_does} {requests} "
        "(--allow-open: proxy them all)",
    )
    return [f"{d.text()} at {d.where} was not translated (nginx {nginx_does} {requests})"]


def _answer(block: list[Directive]) -> str | None:
    """What an if block answers when it refuses or redirects (``return 403``, ``deny``), else None."""
    for x in block:
        if x.name == "return" and x.args:
            code = x.args[0]
            if not code.isdigit():
                return "redirects"
            if int(code) >= 300:
                return f"answers {code} to"
        if x.name == "deny":
            return "answers 403 to"
        if x.name == "rewrite" and x.args[-1:] in (["redirect"], ["permanent"]):
            return "redirects"
    return None


def if_block(ctx: Context, d: Directive) -> list[str]:
    assert d.block is not None
    answer = _answer(d.block)
    requests = f"requests matching {condition(d)[3:]}"
    if answer is None:
        inner = ", ".join(sorted({x.name for x in d.block})) or "nothing"
        ctx.skip(d, f'"if" is not translated: {requests} do not get what it holds ({inner})')
        return []
    return _refusal(ctx, d, requests, answer)


def limit_except(ctx: Context, d: Directive) -> list[str]:
    methods = " ".join(d.args)
    return _refusal(ctx, d, f"requests with a method other than {methods}", "applies its allow/deny rules to")


def location_rules(ctx: Context, rules: list[Directive]) -> list[str]:
    """allow/deny in a location (or a server among several): nginx's first-match list, not translated."""
    if all(r.name == "allow" and r.args == ["all"] for r in rules):
        for r in rules:
            ctx.result.same_here(r)
        return []
    listed = "; ".join(r.text().removesuffix(";") for r in rules)
    out: list[str] = []
    for r in rules:
        out += _refusal(ctx, r, f"clients that ({listed}) refuses", "answers 403 to")
    return out[:1]


def auth(ctx: Context, scope: Scope) -> list[str]:
    """``auth_basic``/``auth_request`` in force for a route (inherited, not ``off``): the gateway checks no
    credentials, so the route refuses (or, with ``--allow-open``, lets every client through, listed)."""
    out: list[str] = []
    for name in AUTH:
        d = scope.get(name)
        if d is not None and d.args != ["off"]:
            out += _refusal(ctx, d, "clients without credentials", "asks for credentials from")
    return out
