"""Limit keys written with nginx variables, compiled once into extractor functions.

A key template such as ``$binary_remote_addr$arg_r`` is parsed when the config
loads. At request time the compiled extractor returns the key as ``bytes``;
``b""`` means "no key", and the limit is skipped for that request, as in nginx.

Supported variables: ``$binary_remote_addr`` (4 or 16 raw bytes), ``$remote_addr``,
``$http_<name>``, ``$arg_<name>``, ``$cookie_<name>``, ``$uri``, ``$request_uri``,
``$host``, ``$request_method``, ``$server_port``, ``$scheme``. ``${name}`` is accepted
too, for a variable followed by letters.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.context import RequestContext

KeyFn = Callable[["RequestContext"], bytes]

_SIMPLE = {
    "binary_remote_addr",
    "remote_addr",
    "uri",
    "request_uri",
    "host",
    "request_method",
    "server_port",
    "scheme",
}
_PREFIXED = ("http_", "arg_", "cookie_")
_VAR = re.compile(r"\$(?:\{([A-Za-z0-9_]+)\}|([A-Za-z0-9_]+))")


@dataclass(frozen=True, slots=True)
class KeyTemplate:
    """A parsed key: literal bytes and variable names, in order."""

    source: str
    parts: tuple[tuple[str, str], ...]  # ("lit", text) or ("var", name)

    @property
    def variables(self) -> tuple[str, ...]:
        return tuple(value for kind, value in self.parts if kind == "var")

    def __str__(self) -> str:
        return self.source


def parse_key(value: object) -> KeyTemplate:
    """Parse a key template; raise ValueError naming an unknown variable like nginx does."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a key such as $binary_remote_addr, got {value!r}")
    parts: list[tuple[str, str]] = []
    pos = 0
    for match in _VAR.finditer(value):
        if match.start() > pos:
            parts.append(("lit", value[pos : match.start()]))
        name = match.group(1) or match.group(2)
        if name not in _SIMPLE and not (name.startswith(_PREFIXED) and len(name) > len(name.split("_", 1)[0]) + 1):
            raise ValueError(f'unknown "{name}" variable')
        parts.append(("var", name))
        pos = match.end()
    if pos < len(value):
        rest = value[pos:]
        if "$" in rest:
            raise ValueError(f"invalid variable name in key {value!r}")
        parts.append(("lit", rest))
    return KeyTemplate(source=value, parts=tuple(parts))


# -- extraction ---------------------------------------------------------------------------


def _first_header(name: str) -> KeyFn:
    header = name.replace("_", "-")
    if header.lower() == "cookie":
        return lambda ctx: "; ".join(ctx.headers.getall("Cookie", ())).encode("utf-8", "surrogateescape")
    if header.lower() == "x-forwarded-for":
        return lambda ctx: ", ".join(ctx.headers.getall("X-Forwarded-For", ())).encode("utf-8", "surrogateescape")
    return lambda ctx: ctx.headers.get(header, "").encode("utf-8", "surrogateescape")


def _arg(name: str) -> KeyFn:
    wanted = name.lower()

    def extract(ctx: RequestContext) -> bytes:
        query = ctx.raw_query
        if not query:
            return b""
        for pair in query.split("&"):
            key, _, val = pair.partition("=")
            if key.lower() == wanted:
                return val.encode("utf-8", "surrogateescape")
        return b""

    return extract


def _cookie(name: str) -> KeyFn:
    wanted = name.lower()

    def extract(ctx: RequestContext) -> bytes:
        for header in ctx.headers.getall("Cookie", ()):
            for pair in header.split(";"):
                key, _, val = pair.strip().partition("=")
                if key.lower() == wanted:
                    return val.encode("utf-8", "surrogateescape")
        return b""

    return extract


def _variable(name: str) -> KeyFn:
    if name == "binary_remote_addr":
        return lambda ctx: ctx.client.packed
    if name == "remote_addr":
        return lambda ctx: ctx.client.text.encode()
    if name == "uri":
        return lambda ctx: ctx.uri.encode("utf-8", "surrogateescape")
    if name == "request_uri":
        return lambda ctx: ctx.raw_target.encode("utf-8", "surrogateescape")
    if name == "host":
        return lambda ctx: ctx.host.encode("utf-8", "surrogateescape")
    if name == "request_method":
        return lambda ctx: ctx.method.encode("utf-8", "surrogateescape")
    if name == "server_port":
        return lambda ctx: str(ctx.server_port).encode()
    if name == "scheme":
        return lambda ctx: ctx.scheme.encode()
    if name.startswith("http_"):
        return _first_header(name[5:])
    if name.startswith("arg_"):
        return _arg(name[4:])
    if name.startswith("cookie_"):
        return _cookie(name[7:])
    raise ValueError(f'unknown "{name}" variable')  # parse_key has already refused it


def _literal(data: bytes) -> KeyFn:
    return lambda ctx: data


def compile_key(template: KeyTemplate) -> KeyFn:
    """Build the extractor; a key of one variable costs one call, nothing more.

    Like nginx's complex values, literal text is kept even when every variable is
    empty, so only a key made of variables alone can come out empty (and be skipped).
    """
    fns: list[KeyFn] = []
    for kind, value in template.parts:
        if kind == "var":
            fns.append(_variable(value))
        else:
            fns.append(_literal(value.encode()))
    if len(fns) == 1:
        return fns[0]
    if len(fns) == 2:
        first, second = fns
        return lambda ctx: first(ctx) + second(ctx)
    return lambda ctx: b"".join([fn(ctx) for fn in fns])
