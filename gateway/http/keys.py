"""Limit keys written with nginx variables, compiled once into extractor functions.

A key template such as ``$binary_remote_addr$arg_r`` is parsed when the config
loads. At request time the compiled extractor returns the key as ``bytes``;
``b""`` means "no key", and the limit is skipped for that request, as in nginx.

Supported variables: ``$binary_remote_addr`` (4 or 16 raw bytes), ``$remote_addr``,
``$http_<name>``, ``$arg_<name>``, ``$cookie_<name>``, ``$uri``, ``$request_uri``,
``$host``, ``$request_method``, ``$server_port``, ``$scheme``, ``$server_name``, ``$request_id``
(a map's source may use it; a zone key may not, see ``gateway.config.zones``). ``${name}`` is accepted
too, for a variable followed by letters.

Variables defined by the configuration (``maps:`` and ``geo:``, see ``gateway.http.maps``)
are accepted when the parser is given their names (``Defined``) and compiled through the
``variables`` mapping; a config without them compiles exactly as before.

Two zone settings are compiled into the extractor, so the request path pays nothing
for them when they are off and never parses an address:

* ``ipv6_prefix``: IPv6 client addresses are masked to this many bits before
  ``$binary_remote_addr`` and ``$remote_addr`` read them (128 = unchanged, nginx's
  value; 64 = one key per /64). IPv4 addresses are never masked, and neither are
  NAT64 addresses (64:ff9b::/96, 64:ff9b:1::/48), which stand for IPv4 clients.
* ``max_key``: a key longer than this many bytes is replaced by ``HASHED_MARK`` and
  its 16-byte BLAKE2b digest, so no store ever holds more than ``max_key`` bytes of
  key. Templates that cannot exceed ``max_key`` (``$binary_remote_addr``, ...) are
  not wrapped at all.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.http.context import RequestContext

KeyFn = Callable[["RequestContext"], bytes]


class UserVariable(Protocol):
    """A variable the configuration defines (a map or a geo), as the key compiler uses it."""

    @property
    def longest(self) -> int | None:
        """The most bytes its value can have, or None when unbounded."""

    def key_fn(self, ipv6_prefix: int) -> KeyFn:
        """Its value for a request; ``ipv6_prefix`` masks the client address its values hold."""


UserVariables = Mapping[str, UserVariable]


@dataclass(frozen=True, slots=True)
class Defined:
    """The names of the variables a configuration defines, as its parser checks templates."""

    names: frozenset[str] = frozenset()
    binary: frozenset[str] = frozenset()  # can hold $binary_remote_addr's raw bytes: not for texts
    addressed: frozenset[str] = frozenset()  # can hold the client's address: a zone's ipv6_prefix applies


NO_DEFINED = Defined()

_SIMPLE = {
    "binary_remote_addr",
    "remote_addr",
    "uri",
    "request_uri",
    "host",
    "request_method",
    "server_port",
    "scheme",
    "server_name",
    "request_id",
}
_PREFIXED = ("http_", "arg_", "cookie_")
# The longest value of the variables that have one (IPv6 text is at most 39 characters).
_BOUNDED = {"binary_remote_addr": 16, "remote_addr": 39, "server_port": 5, "scheme": 5, "request_id": 32}

DEFAULT_MAX_KEY = 256
MIN_MAX_KEY = 32
MAX_MAX_KEY = 4096
HASHED_MARK = b"\xff"  # never the first byte of UTF-8 text; a hashed key is 17 bytes
DIGEST_SIZE = 16
ADDRESS_VARIABLES = ("binary_remote_addr", "remote_addr")
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


def is_variable_name(name: str) -> bool:
    """``name`` (without its ``$``) is a variable a key may use: ``binary_remote_addr``,
    ``http_x_api_key``, ..."""
    return name in _SIMPLE or (name.startswith(_PREFIXED) and len(name) > len(name.split("_", 1)[0]) + 1)


def parse_key(value: object, defined: Defined = NO_DEFINED) -> KeyTemplate:
    """Parse a key template; raise ValueError naming an unknown variable like nginx does.
    The names in ``defined`` (maps and geo of the configuration) are variables too."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a key such as $binary_remote_addr, got {value!r}")
    parts: list[tuple[str, str]] = []
    pos = 0
    for match in _VAR.finditer(value):
        if match.start() > pos:
            parts.append(("lit", value[pos : match.start()]))
        name = match.group(1) or match.group(2)
        if not is_variable_name(name) and name not in defined.names:
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


def cookie_value(header: bytes, name: bytes) -> bytes | None:
    """The value of cookie ``name`` (lower case) in one ``Cookie`` header, as nginx 1.22's
    ``ngx_http_parse_multi_header_lines`` finds it; None when it is not there.

    A pair starts at the header's start or after ``;`` or ``,`` and the spaces after it; its name
    matches without regard to ASCII case, then spaces, ``=``, spaces; the value runs to the next
    ``;`` (a ``,`` or a quote is part of it, trailing spaces too). When the name is followed by
    anything but ``=``, nginx steps over that one byte before looking for the next separator
    (``admin;admin=yes`` has no ``admin``): kept, so that both read the same value."""
    n = len(name)
    end = len(header)
    if n > end:
        return None
    lowered = header.lower()  # bytes.lower(): ASCII only, as ngx_strncasecmp
    start = 0
    while start < end:
        if lowered.startswith(name, start):
            start += n
            while start < end and header[start] == 0x20:
                start += 1
            if start < end:
                start += 1
                if header[start - 1] == 0x3D:  # "="
                    while start < end and header[start] == 0x20:
                        start += 1
                    last = header.find(b";", start)
                    return header[start:] if last < 0 else header[start:last]
        while start < end:  # to the byte after the next ";" or ","
            start += 1
            if header[start - 1] in b";,":
                break
        while start < end and header[start] == 0x20:
            start += 1
    return None


def _cookie(name: str) -> KeyFn:
    wanted = name.lower().encode("utf-8", "surrogateescape")

    def extract(ctx: RequestContext) -> bytes:
        for header in ctx.headers.getall("Cookie", ()):  # in order: the first header that has it wins
            value = cookie_value(header.encode("utf-8", "surrogateescape"), wanted)
            if value is not None:
                return value
        return b""

    return extract


def _v6_mask(prefix: int) -> int:
    return ((1 << 128) - 1) ^ ((1 << (128 - prefix)) - 1)


# NAT64 prefixes (RFC 6052's 64:ff9b::/96, RFC 8215's 64:ff9b:1::/48): behind a
# translator every IPv4 client of the Internet has an address in them, so these
# are IPv4 hosts, never one IPv6 host's /64. They keep their whole address.
_NAT64_WELL_KNOWN = 0x0064_FF9B_0000_0000_0000_0000  # the top 96 bits of 64:ff9b::/96
_NAT64_LOCAL = 0x0064_FF9B_0001  # the top 48 bits of 64:ff9b:1::/48


def _masker(ipv6_prefix: int) -> Callable[[int], int]:
    """The client address as a zone key sees it: IPv6 masked to the prefix, but not NAT64'd IPv4."""
    mask = _v6_mask(ipv6_prefix)

    def masked(value: int) -> int:
        if value >> 32 == _NAT64_WELL_KNOWN or value >> 80 == _NAT64_LOCAL:
            return value
        return value & mask

    return masked


def _binary_remote_addr(ipv6_prefix: int) -> KeyFn:
    if ipv6_prefix >= 128:
        return lambda ctx: ctx.client.packed
    masked = _masker(ipv6_prefix)

    def extract(ctx: RequestContext) -> bytes:
        client = ctx.client
        if client.version != 6:
            return client.packed
        return masked(client.value).to_bytes(16, "big")

    return extract


def _remote_addr(ipv6_prefix: int) -> KeyFn:
    if ipv6_prefix >= 128:
        return lambda ctx: ctx.client.text.encode()
    masked = _masker(ipv6_prefix)

    @lru_cache(maxsize=4096)  # formatting an address costs ~8 us; a /64 comes back often
    def text_of(value: int) -> bytes:
        return ipaddress.IPv6Address(value).compressed.encode()

    def extract(ctx: RequestContext) -> bytes:
        client = ctx.client
        if client.version != 6:
            return client.text.encode()
        return text_of(masked(client.value))

    return extract


def key_variable(name: str, ipv6_prefix: int = 128, variables: UserVariables | None = None) -> KeyFn:
    """The bytes of one key variable (``$binary_remote_addr``, ``$http_x``, ...) of a request;
    a name in ``variables`` is the configuration's own (a map or a geo)."""
    if variables is not None and name in variables:
        return variables[name].key_fn(ipv6_prefix)
    if name == "binary_remote_addr":
        return _binary_remote_addr(ipv6_prefix)
    if name == "remote_addr":
        return _remote_addr(ipv6_prefix)
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
    if name == "server_name":
        return lambda ctx: ctx.server.name.encode("utf-8", "surrogateescape") if ctx.server is not None else b""
    if name == "request_id":
        return lambda ctx: ctx.request_id.encode()
    if name.startswith("http_"):
        return _first_header(name[5:])
    if name.startswith("arg_"):
        return _arg(name[4:])
    if name.startswith("cookie_"):
        return _cookie(name[7:])
    raise ValueError(f'unknown "{name}" variable')  # parse_key has already refused it


def _literal(data: bytes) -> KeyFn:
    return lambda ctx: data


def longest_key(template: KeyTemplate, variables: UserVariables | None = None) -> int | None:
    """The most bytes the template can produce, or None when a variable is unbounded."""
    total = 0
    for kind, value in template.parts:
        if kind == "lit":
            total += len(value.encode())
        elif value in _BOUNDED:
            total += _BOUNDED[value]
        elif variables is not None and value in variables:
            longest = variables[value].longest
            if longest is None:
                return None
            total += longest
        else:
            return None
    return total


def hashed_key(key: bytes) -> bytes:
    """The fixed-size stand-in for a key longer than its zone's ``max_key``."""
    return HASHED_MARK + hashlib.blake2b(key, digest_size=DIGEST_SIZE).digest()


def _bounded(fn: KeyFn, max_key: int) -> KeyFn:
    def extract(ctx: RequestContext) -> bytes:
        key = fn(ctx)
        return key if len(key) <= max_key else hashed_key(key)

    return extract


def _concatenate(template: KeyTemplate, ipv6_prefix: int, variables: UserVariables | None) -> KeyFn:
    fns: list[KeyFn] = []
    for kind, value in template.parts:
        if kind == "var":
            fns.append(key_variable(value, ipv6_prefix, variables))
        else:
            fns.append(_literal(value.encode()))
    if not fns:
        return _literal(b"")
    if len(fns) == 1:
        return fns[0]
    if len(fns) == 2:
        first, second = fns
        return lambda ctx: first(ctx) + second(ctx)
    return lambda ctx: b"".join([fn(ctx) for fn in fns])


def compile_text(template: KeyTemplate, *, ipv6_prefix: int = 128, variables: UserVariables | None = None) -> KeyFn:
    """The template's bytes for a request, whatever their length (a map's source and values)."""
    return _concatenate(template, ipv6_prefix, variables)


def compile_key(
    template: KeyTemplate,
    *,
    max_key: int = DEFAULT_MAX_KEY,
    ipv6_prefix: int = 128,
    variables: UserVariables | None = None,
) -> KeyFn:
    """Build the extractor; a key of one variable costs one call, nothing more.

    Like nginx's complex values, literal text is kept even when every variable is
    empty, so only a key made of variables alone can come out empty (and be skipped).
    A template that can produce more than ``max_key`` bytes gets its long keys hashed;
    ``ipv6_prefix`` below 128 masks IPv6 client addresses (see the module docstring);
    ``variables``: the maps and geo of the configuration, by name.
    """
    if not 1 <= ipv6_prefix <= 128:
        raise ValueError(f"ipv6_prefix must be between 1 and 128, got {ipv6_prefix}")
    if not MIN_MAX_KEY <= max_key <= MAX_MAX_KEY:
        raise ValueError(f"max_key must be between {MIN_MAX_KEY} and {MAX_MAX_KEY}, got {max_key}")
    fn = _concatenate(template, ipv6_prefix, variables)
    longest = longest_key(template, variables)
    if longest is not None and longest <= max_key:
        return fn
    return _bounded(fn, max_key)


def key_from_text(template: KeyTemplate, text: str, *, max_key: int = DEFAULT_MAX_KEY, ipv6_prefix: int = 128) -> bytes:
    """The key a zone stores for ``text``, as an operator types it (``gateway zone show``):
    a client address for ``$binary_remote_addr`` / ``$remote_addr`` (IPv6 masked as the zone
    masks it), else the key's text; hashed like the extractor does when over ``max_key``.
    ValueError when the text cannot be such a key."""
    if (
        template.variables
        and template.parts == (("var", template.variables[0]),)
        and (template.variables[0] in ADDRESS_VARIABLES)
    ):
        try:
            address = ipaddress.ip_address(text.strip())
        except ValueError:
            raise ValueError(f"the key of a {template.source} zone is an IP address, not {text!r}") from None
        value = int(address)
        if address.version == 6 and ipv6_prefix < 128:
            value = _masker(ipv6_prefix)(value)
        if template.variables[0] == "binary_remote_addr":
            return value.to_bytes(4 if address.version == 4 else 16, "big")
        return str(ipaddress.ip_address(value) if address.version == 4 else ipaddress.IPv6Address(value)).encode()
    if "binary_remote_addr" in template.variables:
        raise ValueError(f"a {template.source} key holds raw address bytes: it cannot be typed as text")
    key = text.encode("utf-8", "surrogateescape")
    longest = longest_key(template)
    if len(key) > max_key and (longest is None or longest > max_key):
        return hashed_key(key)
    return key
