"""nginx's ``if (CONDITION) { return ...; }``: guard rules, parsed and compiled once.

A rule is a condition and the ``return`` to answer with when it holds. The conditions are
nginx's, on variables:

* ``$var`` alone: true unless the value is empty or ``"0"``;
* ``$var = text`` and ``$var != text``: string comparison (the text may hold variables);
* ``$var ~ regex`` and ``$var ~* regex`` (case-insensitive): a regex search, as PCRE's (``pcre``);
  ``!~`` and ``!~*`` negate them.

Operators are separated by spaces, as in nginx. The right side may be quoted (``'x'`` or
``"x"``, quotes taken off as nginx's tokenizer does), and the whole condition may be written
in nginx's parentheses. File tests (``-f``, ``-d``, ``-e``, ``-x``) are refused: the gateway
serves no files. Variables go through the same machinery as header values (``templates``), so
every variable a value may use, a condition may test: the configuration's maps and geo too
(``$bad_bot`` from ``map $http_user_agent $bad_bot {...}``), looked up once per request. Regexes
compile when the config loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.http.keys import NO_DEFINED, Defined, UserVariables
from gateway.http.pcre import compile_pcre
from gateway.http.templates import ValueTemplate, compile_value, parse_value

if TYPE_CHECKING:
    from gateway.http.context import RequestContext
    from gateway.http.returns import ReturnPlan

TestFn = Callable[["RequestContext"], bool]
OPERATORS = ("=", "!=", "~", "~*", "!~", "!~*")
_VARIABLE = re.compile(r"\$(?:[A-Za-z0-9_]+|\{[A-Za-z0-9_]+\})")


@dataclass(frozen=True, slots=True)
class Condition:
    """A parsed condition: the variable tested, the operator ("" for the variable alone),
    and the text or regex it is compared with."""

    source: str
    variable: ValueTemplate
    op: str
    value: ValueTemplate | None = None
    pattern: re.Pattern[str] | None = None

    def __str__(self) -> str:
        return self.source


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def parse_condition(value: object, defined: Defined = NO_DEFINED) -> Condition:
    """Parse ``$var``, ``$var OP text`` or ``($var OP text)``; ValueError says what is wrong.
    ``defined``: the configuration's maps and geo, variables too."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a condition such as '$request_method = POST', got {value!r}")
    text = value.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    left, *more = text.split(None, 1)
    rest = more[0] if more else ""
    if left.startswith(("-", "!-")):
        raise ValueError(f'file tests such as "{left}" have no meaning here: the gateway serves no files')
    if not _VARIABLE.fullmatch(left):
        raise ValueError(
            f"a condition starts with a variable, such as '$request_method = POST', got {value!r}"
            " (put spaces around the operator)"
        )
    variable = parse_value(left, defined=defined)
    if not rest:
        return Condition(value, variable, "")
    op, *after = rest.split(None, 1)
    right = after[0].strip() if after else ""
    if op not in OPERATORS:
        raise ValueError(f'unknown operator "{op}" in {value!r}: use one of {", ".join(OPERATORS)}')
    if not right:
        raise ValueError(f'nothing after "{op}" in {value!r} (to compare with the empty text, write "")')
    right = _unquote(right)
    if op in ("=", "!="):
        return Condition(value, variable, op, value=parse_value(right, defined=defined))
    if not right:
        raise ValueError(f"an empty regular expression in {value!r}")
    return Condition(value, variable, op, pattern=compile_pcre(right, icase=op.endswith("*")))


def compile_condition(condition: Condition, variables: UserVariables | None = None) -> TestFn:
    """The condition's test of a request (``variables``: the maps and geo, by name)."""
    get = compile_value(condition.variable, body=True, variables=variables)
    op = condition.op
    if op == "":
        return lambda ctx: get(ctx) not in ("", "0")
    if condition.pattern is not None:
        search = condition.pattern.search
        if op.startswith("!"):
            return lambda ctx: search(get(ctx)) is None
        return lambda ctx: search(get(ctx)) is not None
    assert condition.value is not None
    if condition.value.constant:
        wanted = condition.value.source
        if op == "=":
            return lambda ctx: get(ctx) == wanted
        return lambda ctx: get(ctx) != wanted
    other = compile_value(condition.value, body=True, variables=variables)
    if op == "=":
        return lambda ctx: get(ctx) == other(ctx)
    return lambda ctx: get(ctx) != other(ctx)


@dataclass(frozen=True, slots=True)
class RulePlan:
    """A compiled rule: when ``test`` holds, answer ``ret``."""

    condition: str  # as written, for logs and listings
    test: TestFn
    ret: ReturnPlan


def first_answer(rules: tuple[RulePlan, ...], ctx: RequestContext) -> ReturnPlan | None:
    """The return of the first rule whose condition holds (nginx runs them in order), or None."""
    for rule in rules:
        if rule.test(ctx):
            return rule.ret
    return None
