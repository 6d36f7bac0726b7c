"""Guards: ``if (...) { return ...; }`` as rules, and those the gateway cannot express
(other ``if`` blocks, ``limit_except``, ``allow``/``deny`` lists).

An ``if`` whose block is one ``return`` (of a code no ``error_page`` of the server takes
over: ``return 418`` with ``error_page 418 = @php`` hands the request on; a plain local page,
``error_page 403 /403.html``, only changes the body, which is noted), on a condition the
gateway's rules test (``=``, ``!=``, ``~``, ``~*``, ``!~``, ``!~*`` or a variable alone, on
variables it knows, the map and geo translated included) becomes a rule (``rule``): the
server's run before a location is chosen, a location's before its limits, in the order
written, as nginx's rewrite phase runs them.

An ``if`` after a ``set`` or ``rewrite`` of its block (or an ``if`` holding one) is no rule:
nginx runs them first, and they change what the condition sees (``set $blocked 1;`` then
``if ($blocked)``; a rewritten ``$uri``). Nor is one whose condition or return reads a
variable a ``set`` of its block or of its server assigns.

Any other guard (a file test, ``set``, ``rewrite`` or another directive in the block, a
variable the gateway does not know, a ``set`` or ``rewrite`` beside it as above): leaving one
out would let the requests it refuses reach the backend, so each is listed with what it does
in nginx and why it is not translated, and returned as a *refusal*: the route (or every route
of the server) then answers 403 to every request, unless the import runs with
``--allow-open``, where the route proxies and the listing says which requests now reach the
backend.

``auth_basic`` and ``auth_request`` are guards too: the gateway checks no credentials.

An ``if`` that only answers 1xx/2xx itself (a CORS preflight's ``return 204``), sets
variables or adds headers is no guard: it is listed as not translated, without refusing.
"""

from __future__ import annotations

import re

from gateway.http.rules import parse_condition
from gateway.http.templates import parse_value
from gateway.nginxconf.context import Context
from gateway.nginxconf.parser import Directive
from gateway.nginxconf.result import Doc
from gateway.nginxconf.scope import Scope
from gateway.nginxconf.values import AUTH, return_value

REWRITE_PHASE = ("set", "rewrite")
_READS = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")  # the variables a condition or a return reads


def condition(d: Directive) -> str:
    """``if`` and its condition as written (quotes kept), without the block."""
    return d.text().removesuffix(" { ... }")


def _refusal(ctx: Context, d: Directive, requests: str, nginx_does: str, why: str = "") -> list[str]:
    """Lists ``d``; a refusal reason unless ``--allow-open``. ``why``: why it is not translated."""
    because = f" ({why})" if why else ""
    if ctx.allow_open:
        ctx.skip(d, f"not translated{because} (--allow-open): {requests} reach the backend; nginx {nginx_does} them")
        return []
    ctx.skip(
        d,
        f"not translated{because}: the route refuses every request (403) instead; nginx {nginx_does} {requests}, "
        "which would otherwise reach the backend (--allow-open: proxy them all)",
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


def if_block(ctx: Context, d: Directive, why: str = "") -> list[str]:
    assert d.block is not None
    answer = _answer(d.block)
    requests = f"requests matching {condition(d)[3:]}"
    if answer is None:
        inner = ", ".join(sorted({x.name for x in d.block})) or "nothing"
        ctx.skip(d, f'"if" is not translated: {requests} do not get what it holds ({inner})')
        return []
    return _refusal(ctx, d, requests, answer, why)


def _condition_text(args: list[str], quoted: frozenset[int]) -> str:
    """nginx's ``if`` arguments (parentheses as nginx strips them) as a rule's condition."""
    words = list(args)
    if words and words[0].startswith("("):
        words[0] = words[0][1:]
        if not words[0]:
            words.pop(0)
            quoted = frozenset(i - 1 for i in quoted)
    if words and words[-1].endswith(")") and (len(words) - 1) not in quoted:
        words[-1] = words[-1][:-1]
        if not words[-1]:
            words.pop()
    if len(words) == 3:
        value = words[2]
        if not value or (len(words) - 1) in quoted or any(c.isspace() for c in value) or value[0] in "'\"":
            value = f"'{value}'" if "'" not in value else f'"{value}"'
        words[2] = value
    return " ".join(words)


def _rewrites(x: Directive) -> bool:
    """A ``set`` or ``rewrite`` (or an ``if`` holding one): it changes what a later condition sees."""
    return x.name in REWRITE_PHASE or (x.name == "if" and any(_rewrites(y) for y in x.block or []))


def assigned(block: list[Directive]) -> dict[str, Directive]:
    """The variables a ``set`` of ``block`` (or of an ``if`` in it) assigns: name -> the set."""
    out: dict[str, Directive] = {}
    for x in block:
        if x.name == "set" and x.args:
            out.setdefault(x.args[0].lstrip("$").strip("{}"), x)
        elif x.name == "if":
            out = assigned(x.block or []) | out
    return out


def _rewritten(ctx: Context, d: Directive, block: list[Directive]) -> str:
    """Why a ``set``/``rewrite`` keeps ``d`` from being a rule ("" when none does): one written
    before it in ``block`` runs first (nginx's rewrite phase), and one anywhere in scope (this
    block, the server's) may assign a variable the condition or the return reads."""
    earlier = next((x for x in block[: next(i for i, x in enumerate(block) if x is d)] if _rewrites(x)), None)
    if earlier is not None:
        return f"the {earlier.name} at {earlier.where} runs before it in nginx and changes what it tests"
    sets = ctx.assigned | assigned(block)
    name = min(_reads(ctx, d) & sets.keys(), default="")
    return f"the set at {sets[name].where} assigns ${name}, which it reads" if name else ""


def _words(d: Directive) -> list[str]:
    return [*d.args, *(w for x in d.block or [] for w in _words(x))]


def _reads(ctx: Context, d: Directive) -> set[str]:
    """The variables ``d`` (a condition and its block) reads, and those the maps and geo it reads read."""
    read: set[str] = set()
    todo = [d]
    while todo:
        new = {m.group(1) for m in _READS.finditer(" ".join(_words(todo.pop())))} - read
        read |= new
        todo += [ctx.variables.where[name] for name in new if name in ctx.variables.where]
    return read


def rule(ctx: Context, d: Directive, block: list[Directive]) -> tuple[Doc | None, str]:
    """``if (COND) { return ...; }`` of ``block`` as a rule ``{if: COND, return: ...}``; else None and why not."""
    assert d.block is not None
    inner = d.block
    if len(inner) != 1 or inner[0].name != "return":
        names = ", ".join(sorted({x.name for x in inner if x.name != "return"})) or "nothing"
        return None, f"its block holds {names}, not a return alone"
    why = _rewritten(ctx, d, block)
    if why:
        return None, why
    text = _condition_text(d.args, d.quoted)
    try:
        parse_condition(text, ctx.result.defined)
    except ValueError as exc:
        return None, str(exc)
    value = return_value(inner[0])
    if value is None:
        return None, "its return is not a code 200..599 (and text) or a URL"
    page = ctx.error_pages.get(str(value["code"]))
    if page is not None and hands_on(page):
        return None, f"the error_page at {page.where} takes over its {value['code']} (the gateway follows none)"
    for key in ("url", "text"):
        try:
            parse_value(value.get(key, ""), body=key == "text", defined=ctx.result.defined)
        except ValueError as exc:
            return None, f"its return: {exc}"
    if page is not None:
        ctx.result.note(
            f"{d.where}: nginx answers its {value['code']} with the page of the error_page at {page.where}; "
            "the gateway's rule answers the same code with its own body"
        )
    return {"if": text, "return": value if len(value) > 1 else value["code"]}, ""


def hands_on(d: Directive) -> bool:
    """An ``error_page`` that changes the answer in a way the gateway cannot reproduce: another
    code (``=200``; ``=``, the page's own), a named location or a redirect. A plain local page
    (``error_page 403 /403.html``) answers the same code, with another body."""
    return any(a.startswith("=") for a in d.args[1:]) or not d.args or not d.args[-1].startswith("/")


def guard(ctx: Context, d: Directive, rules: list[Doc], block: list[Directive]) -> list[str]:
    """An ``if`` of a server or location ``block``: a rule appended to ``rules``, or listed (and a refusal)."""
    translated, why = rule(ctx, d, block)
    if translated is not None:
        rules.append(translated)
        return []
    return if_block(ctx, d, why)


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
