"""``servers:``: virtual hosts, each with its names, listen addresses and routes (nginx's
``server`` blocks).

A config without ``servers:`` has one server: today's top-level ``routes:``, with no
name, on every ``listen`` address. With ``servers:``, top-level ``routes:`` is not
allowed; a server without ``listen`` uses the top-level ``listen`` (default
0.0.0.0:8080). Names are exact (``api.example.com``), leading wildcards
(``*.example.org``), trailing wildcards (``www.example.*``), ``.example.org`` (the name
and all its subdomains) or regular expressions (``~^(?<sub>.+)\\.example\\.net$``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.config.access import parse_access_rules
from gateway.config.reader import Reader, as_bool
from gateway.errors import KeyPath
from gateway.http.access import AccessRule
from gateway.http.pcre import compile_pcre
from gateway.http.vhosts import wildcard_of

if TYPE_CHECKING:
    from gateway.config.tls import TlsSpec

SERVER_KEYS = ("server_name", "listen", "default_server", "rules", "access", "routes")


@dataclass(frozen=True, slots=True)
class ListenSpec:
    """One ``listen`` entry: an address to bind, whether it speaks TLS (nginx's ``ssl``), and
    whether each connection starts with a PROXY protocol header (nginx's ``proxy_protocol``)."""

    host: str
    port: int
    ssl: bool = False
    proxy_protocol: bool = False

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" + (" ssl" if self.ssl else "") + (" proxy_protocol" if self.proxy_protocol else "")


@dataclass(frozen=True, slots=True)
class ServerName:
    kind: str  # "exact", "leading" (*.x or .x), "trailing" (x.*), "regex"
    value: str  # lower case; for leading: ".example.org"; trailing: "www.example."
    pattern: re.Pattern[str] | None = None
    also_exact: bool = False  # ".example.org" also names example.org

    def __str__(self) -> str:
        if self.kind == "regex":
            return "~" + self.value
        if self.kind == "leading":
            return ("" if self.also_exact else "*") + self.value
        if self.kind == "trailing":
            return self.value + "*"
        return self.value


@dataclass(frozen=True, slots=True, kw_only=True)
class VirtualServerSpec:
    index: int
    names: tuple[ServerName, ...]
    listen: tuple[ListenSpec, ...]
    default: bool
    routes: tuple[Any, ...]  # RouteSpec
    tls: TlsSpec | None = None  # this server's certificates and ssl_* settings (the top level's when unset)
    rules: tuple[Any, ...] = ()  # RuleSpec: run before a route is chosen (nginx's server rewrite phase)
    access: tuple[AccessRule, ...] | None = None  # its own allow/deny list (None: the top level's)

    @property
    def name(self) -> str:
        """``$server_name``: the first name as written, or empty."""
        return str(self.names[0]) if self.names else ""


_LABELS = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")


def parse_server_name(value: Any) -> ServerName:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a server name such as api.example.com or *.example.org, got {value!r}")
    text = value.strip()
    if text.startswith("~"):
        source = text[1:]
        return ServerName("regex", source, compile_pcre(source, icase=True))
    name = text.lower()
    if name.startswith("*.") and _LABELS.fullmatch(name[2:]):
        return ServerName("leading", name[1:])
    if name.startswith(".") and _LABELS.fullmatch(name[1:]):
        return ServerName("leading", name, also_exact=True)
    if name.endswith(".*") and _LABELS.fullmatch(name[:-2]):
        return ServerName("trailing", name[:-1])
    if "*" in name:
        raise ValueError(f'invalid server name "{text}": a wildcard is allowed only as "*.name" or "name.*"')
    if name and not _LABELS.fullmatch(name.rstrip(".")):
        raise ValueError(f'invalid server name "{text}"')
    return ServerName("exact", name.rstrip("."))


def parse_servers(
    r: Reader,
    value: Any,
    default_listen: tuple[ListenSpec, ...],
    listen_of: Callable[[Any, KeyPath], tuple[ListenSpec, ...]],
    routes_of: Callable[[Any, KeyPath], tuple[Any, ...]],
    tls_of: Callable[[dict[str, Any], KeyPath], TlsSpec | None] = lambda data, path: None,
    extra_keys: tuple[str, ...] = (),
    rules_of: Callable[[Any, KeyPath], tuple[Any, ...]] = lambda value, path: (),
) -> tuple[VirtualServerSpec, ...]:
    items = r.sequence(value, ("servers",))
    if isinstance(value, list) and not items:
        r.error(("servers",), "at least one server is required")
    out: list[VirtualServerSpec] = []
    defaults_at: dict[tuple[str, int], int] = {}
    for i, item in enumerate(items):
        path: KeyPath = ("servers", i)
        data = r.mapping(item, path, SERVER_KEYS + extra_keys, required=("routes",))
        if data is None:
            continue
        names: list[ServerName] = []
        raw_names = data.get("server_name", [])
        for j, raw in enumerate(r.sequence(raw_names, path + ("server_name",), allow_scalar=True)):
            where = path + ("server_name", j) if isinstance(raw_names, list) else path + ("server_name",)
            try:
                names.append(parse_server_name(raw))
            except ValueError as exc:
                r.error(where, str(exc))
        listen = listen_of(data["listen"], path + ("listen",)) if "listen" in data else default_listen
        default = bool(r.field(data, "default_server", path, as_bool, False))
        if default:
            for entry in listen:
                addr = entry.address
                if addr in defaults_at:
                    r.error(
                        path + ("default_server",),
                        f"a duplicate default server for {addr[0]}:{addr[1]} (first at servers[{defaults_at[addr]}])",
                    )
                defaults_at.setdefault(addr, i)
        routes = routes_of(data["routes"], path + ("routes",)) if "routes" in data else ()
        tls = tls_of(data, path)
        rules = rules_of(data["rules"], path + ("rules",)) if "rules" in data else ()
        access = parse_access_rules(r, data["access"], path + ("access",)) if "access" in data else None
        out.append(
            VirtualServerSpec(
                index=i,
                names=tuple(names),
                listen=listen,
                default=default,
                routes=routes,
                tls=tls,
                rules=rules,
                access=access,
            )
        )
    return tuple(out)


def bound_addresses(servers: tuple[VirtualServerSpec, ...]) -> tuple[ListenSpec, ...]:
    """Every address to bind, in order; a specific address on a port that a wildcard
    (0.0.0.0 or ::) of its family already covers is served by that socket, as in nginx.
    An address is TLS when any server lists it with ``ssl``, and expects a PROXY protocol header
    when any lists it with ``proxy_protocol`` (nginx: both belong to the socket)."""
    seen: dict[tuple[str, int], tuple[bool, bool]] = {}
    for server in servers:
        for entry in server.listen:
            tls, proxy = seen.get(entry.address, (False, False))
            seen[entry.address] = (tls or entry.ssl, proxy or entry.proxy_protocol)
    wild = {(wildcard_of(host), port) for host, port in seen if host in ("0.0.0.0", "::")}
    return tuple(
        ListenSpec(a[0], a[1], tls, proxy)
        for a, (tls, proxy) in seen.items()
        if a[0] in ("0.0.0.0", "::") or (wildcard_of(a[0]), a[1]) not in wild
    )


def serves(bound: ListenSpec, entry: ListenSpec) -> bool:
    """The socket bound for ``bound`` takes the connections of the listen entry ``entry``."""
    if bound.port != entry.port:
        return False
    return bound.host == entry.host or (bound.host in ("0.0.0.0", "::") and wildcard_of(entry.host) == bound.host)
