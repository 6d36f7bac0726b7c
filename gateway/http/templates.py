"""Header values and return texts written with nginx variables, compiled once.

``proxy_set_header``, ``add_header`` and ``return`` take text such as
``"$scheme://$host$request_uri"``. It is parsed when the config loads (an unknown
variable is a config error, as in nginx) and becomes a function of the request
context; a text without variables costs nothing but returning it.

Variables: those of limit keys except ``$binary_remote_addr`` (``$remote_addr``,
``$uri``, ``$request_uri``, ``$host``, ``$request_method``, ``$server_port``,
``$scheme``, ``$http_<name>``, ``$arg_<name>``, ``$cookie_<name>``), plus ``$args``,
``$realip_remote_addr``, ``$server_name``, ``$request_id``, ``$ssl_protocol``, ``$ssl_cipher``, ``$https``,
``$proxy_protocol_addr``, ``$proxy_protocol_port``
and ``$proxy_add_x_forwarded_for`` (the
client's ``X-Forwarded-For`` with ``$remote_addr`` appended), and the configuration's
maps and geo (``gateway.http.maps``) except those that can hold raw address bytes.
CR, LF and NUL never reach a header: they are replaced by a space.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.http.keys import NO_DEFINED, Defined, UserVariables, key_variable, parse_key

if TYPE_CHECKING:
    from gateway.http.context import RequestContext

ValueFn = Callable[["RequestContext"], str]
_CONTROL = re.compile(r"[\r\n\x00]")
_EXTRA = (
    "args",
    "realip_remote_addr",
    "server_name",
    "request_id",
    "proxy_add_x_forwarded_for",
    "ssl_protocol",
    "ssl_cipher",
    "https",
    "proxy_protocol_addr",
    "proxy_protocol_port",
)


@dataclass(frozen=True, slots=True)
class ValueTemplate:
    source: str
    parts: tuple[tuple[str, str], ...]  # ("lit", text) or ("var", name)

    @property
    def constant(self) -> bool:
        return all(kind == "lit" for kind, _ in self.parts)

    def __str__(self) -> str:
        return self.source


_VAR = re.compile(r"\$(?:\{([A-Za-z0-9_]+)\}|([A-Za-z0-9_]+))")


def builtin_text_variable(name: str) -> bool:
    """``name`` is one of the variables only texts have (``$args``, ``$server_name``, ...)."""
    return name in _EXTRA


def parse_body_text(value: object, defined: Defined = NO_DEFINED) -> ValueTemplate:
    """A response body (``return``'s text): line breaks allowed."""
    return parse_value(value, body=True, defined=defined)


def parse_value(value: object, *, body: bool = False, defined: Defined = NO_DEFINED) -> ValueTemplate:
    """Parse a text with variables; raise ValueError naming an unknown one like nginx does.
    The names in ``defined`` (maps and geo of the configuration) are variables too."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a text (variables allowed), got {type(value).__name__}")
    if not body and _CONTROL.search(value):
        raise ValueError("a value cannot contain CR, LF or NUL")
    parts: list[tuple[str, str]] = []
    pos = 0
    for match in _VAR.finditer(value):
        if match.start() > pos:
            parts.append(("lit", value[pos : match.start()]))
        name = match.group(1) or match.group(2)
        if name == "binary_remote_addr":
            raise ValueError('"$binary_remote_addr" is raw bytes: use $remote_addr in a text')
        if name in defined.binary:
            raise ValueError(f'"${name}" can hold $binary_remote_addr (raw bytes): it cannot be used in a text')
        if name not in _EXTRA:
            parse_key("$" + name, defined)  # raises ValueError for an unknown variable
        parts.append(("var", name))
        pos = match.end()
    if pos < len(value):
        parts.append(("lit", value[pos:]))
    return ValueTemplate(source=value, parts=tuple(parts))


def _proxy_add_x_forwarded_for(ctx: RequestContext) -> str:
    prior = ", ".join(ctx.headers.getall("X-Forwarded-For", ()))
    return f"{prior}, {ctx.client.text}" if prior else ctx.client.text


def _server_name(ctx: RequestContext) -> str:
    return str(ctx.server.name) if ctx.server is not None else ""


def _request_id(ctx: RequestContext) -> str:
    return ctx.request_id


def _literal(text: str) -> ValueFn:
    return lambda ctx: text


def _variable(name: str, variables: UserVariables | None) -> ValueFn:
    if name == "args":
        return lambda ctx: ctx.raw_query
    if name == "realip_remote_addr":
        return lambda ctx: ctx.peer.text
    if name == "server_name":
        return _server_name
    if name == "request_id":
        return _request_id
    if name == "proxy_add_x_forwarded_for":
        return _proxy_add_x_forwarded_for
    if name == "ssl_protocol":
        return lambda ctx: ctx.ssl_protocol
    if name == "ssl_cipher":
        return lambda ctx: ctx.ssl_cipher
    if name == "https":
        return lambda ctx: ctx.https
    if name == "proxy_protocol_addr":
        return lambda ctx: ctx.proxy.addr_text if ctx.proxy is not None else ""
    if name == "proxy_protocol_port":
        return lambda ctx: ctx.proxy.port_text if ctx.proxy is not None else ""
    fn = key_variable(name, variables=variables)
    return lambda ctx: fn(ctx).decode("utf-8", "surrogateescape")


def compile_value(template: ValueTemplate, *, body: bool = False, variables: UserVariables | None = None) -> ValueFn:
    """The text's function of the request; in a header (not ``body``), CR/LF/NUL from
    variables become spaces. ``variables``: the maps and geo of the configuration, by name."""
    if template.constant:
        return _literal(template.source)
    fns: list[ValueFn] = []
    for kind, value in template.parts:
        if kind == "var":
            fns.append(_variable(value, variables))
        else:
            fns.append(_literal(value))
    frozen = tuple(fns)
    control = _CONTROL.search
    if body:
        return lambda ctx: "".join([fn(ctx) for fn in frozen])

    def render(ctx: RequestContext) -> str:
        out = "".join([fn(ctx) for fn in frozen])
        return _CONTROL.sub(" ", out) if control(out) else out

    return render
