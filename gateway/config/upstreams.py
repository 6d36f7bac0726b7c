"""``upstreams:``: named groups of servers, with their connection pools, timeouts, retries and TLS
to the upstream (nginx's ``upstream`` blocks and ``proxy_*`` settings).
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from typing import Any

from gateway.config.reader import Reader, as_bool, as_str, duration_ms, host_port, int_in, one_of, positive_duration_ms
from gateway.config.tls import MAX_PEM_BYTES
from gateway.errors import KeyPath
from gateway.files import read_bounded
from gateway.http.keys import KeyTemplate, parse_key


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSpec:
    """One server of an upstream: ``host:port``, or a Unix-domain socket (``unix:/path``: ``path``
    set, ``host`` empty and ``port`` 0)."""

    host: str
    port: int
    weight: int = 1
    max_fails: int = 1
    fail_timeout_ms: int = 10_000
    backup: bool = False
    down: bool = False
    path: str | None = None  # a Unix-domain socket's path

    @property
    def address(self) -> str:
        """As nginx writes it in ``$upstream_addr``: ``host:port``, ``[v6]:port`` or ``unix:/path``."""
        if self.path is not None:
            return f"unix:{self.path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BalanceSpec:
    """How an upstream picks its server: nginx's default weighted round-robin, ``least_conn``,
    ``ip_hash``, or ``hash KEY [consistent]`` (``balance:`` in the upstream, nginx's spelling)."""

    method: str = "round_robin"  # "round_robin", "least_conn", "ip_hash" or "hash"
    key: KeyTemplate | None = None  # hash: the key
    consistent: bool = False  # hash: the ketama ring

    def __str__(self) -> str:
        if self.method != "hash":
            return self.method
        return f"hash {self.key}" + (" consistent" if self.consistent else "")


def parse_balance(value: Any) -> BalanceSpec:
    """``round_robin``, ``least_conn``, ``ip_hash``, ``hash $key`` or ``hash $key consistent``."""
    words = as_str(value).split()
    if words in (["round_robin"], ["least_conn"], ["ip_hash"]):
        return BalanceSpec(words[0])
    if len(words) in (2, 3) and words[0] == "hash" and (len(words) == 2 or words[2] == "consistent"):
        return BalanceSpec("hash", parse_key(words[1]), len(words) == 3)
    raise ValueError(f"expected round_robin, least_conn, ip_hash or 'hash $key [consistent]', got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamSpec:
    name: str
    servers: tuple[ServerSpec, ...]
    keepalive: int = 32
    keepalive_timeout_ms: int = 60_000
    connect_timeout_ms: int = 5_000
    read_timeout_ms: int = 60_000
    send_timeout_ms: int = 60_000
    next_upstream_tries: int = 0
    scheme: str = "http"
    tls_verify: bool = True
    tls_ca: str | None = None  # a CA bundle (PEM) trusted instead of the system's: a private CA
    tls_server_name: str | None = None  # SNI and the verified name (nginx's proxy_ssl_name); default: the server's host
    host: str | None = None
    balance: BalanceSpec = BalanceSpec()


UPSTREAM_KEYS = (
    "servers",
    "keepalive",
    "keepalive_timeout",
    "connect_timeout",
    "read_timeout",
    "send_timeout",
    "next_upstream_tries",
    "scheme",
    "tls_verify",
    "tls_ca",
    "tls_server_name",
    "host",
    "balance",
)
SERVER_KEYS = ("address", "weight", "max_fails", "fail_timeout", "backup", "down")


def parse_upstreams(r: Reader, value: Any, path: KeyPath) -> dict[str, UpstreamSpec]:
    if not isinstance(value, dict):
        r.error(path, "expected a mapping of upstream names to upstreams")
        return {}
    out: dict[str, UpstreamSpec] = {}
    for name, body in value.items():
        upath = path + (name,)
        data = r.mapping(body, upath, UPSTREAM_KEYS, required=("servers",))
        if data is None:
            continue
        servers = _servers(r, data.get("servers"), upath + ("servers",)) if "servers" in data else ()
        scheme = r.field(data, "scheme", upath, one_of("http", "https"), "http") or "http"
        out[name] = UpstreamSpec(
            name=name,
            servers=servers,
            keepalive=r.field(data, "keepalive", upath, int_in(0, 65535, "keepalive"), 32) or 0,
            keepalive_timeout_ms=r.field(data, "keepalive_timeout", upath, duration_ms, 60_000) or 0,
            connect_timeout_ms=r.field(data, "connect_timeout", upath, positive_duration_ms, 5_000) or 5_000,
            read_timeout_ms=r.field(data, "read_timeout", upath, positive_duration_ms, 60_000) or 60_000,
            send_timeout_ms=r.field(data, "send_timeout", upath, positive_duration_ms, 60_000) or 60_000,
            next_upstream_tries=r.field(data, "next_upstream_tries", upath, int_in(0, 1000, "tries"), 0) or 0,
            scheme=scheme,
            tls_verify=bool(r.field(data, "tls_verify", upath, as_bool, True)),
            tls_ca=r.field(data, "tls_ca", upath, _ca_bundle, None),
            tls_server_name=r.field(data, "tls_server_name", upath, _tls_name, None),
            host=r.field(data, "host", upath, as_str, None),
            balance=r.field(data, "balance", upath, parse_balance, BalanceSpec()) or BalanceSpec(),
        )
        if out[name].balance.method in ("ip_hash", "hash") and any(s.backup for s in servers):
            r.error(upath + ("balance",), f"balance: {out[name].balance} does not support backup servers (as nginx)")
        if servers and all(s.backup or s.down for s in servers):
            r.error(upath + ("servers",), "no usable server: every server is marked backup or down")
        if scheme != "https":
            for key in ("tls_ca", "tls_server_name"):
                if key in data:
                    r.error(upath + (key,), f"{key} applies to scheme: https only", at_key=True)
    return out


def _ca_bundle(value: Any) -> str:
    path = as_str(value)
    try:
        text = read_bounded(path, MAX_PEM_BYTES)  # checked here; the proxy loads it again by name
    except OSError as exc:
        raise ValueError(f"cannot read the CA bundle {path}: {exc.strerror or exc}") from None
    try:
        ssl.create_default_context(cadata=text.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as exc:
        raise ValueError(f"{path} is not a PEM CA bundle: {getattr(exc, 'reason', None) or exc}") from None
    return path


def _tls_name(value: Any) -> str:
    name = as_str(value).strip().rstrip(".").lower()
    if not re.fullmatch(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*", name):
        raise ValueError(f"expected a host name such as api.internal, got {value!r}")
    return name


def _servers(r: Reader, value: Any, path: KeyPath) -> tuple[ServerSpec, ...]:
    items = r.sequence(value, path)
    if isinstance(value, list) and not items:
        r.error(path, "an upstream needs at least one server")
    parse_address = server_address
    out: list[ServerSpec] = []
    for i, item in enumerate(items):
        spath = path + (i,)
        if isinstance(item, dict):
            data = r.mapping(item, spath, SERVER_KEYS, required=("address",))
            if data is None or "address" not in data:
                continue
            addr = r.field(data, "address", spath, parse_address)
            if addr is None:
                continue
            server = ServerSpec(
                host=addr[0],
                port=addr[1],
                path=addr[2],
                weight=r.field(data, "weight", spath, int_in(1, 1000, "weight"), 1) or 1,
                max_fails=r.field(data, "max_fails", spath, int_in(0, 1000, "max_fails"), 1) or 0,
                fail_timeout_ms=r.field(data, "fail_timeout", spath, duration_ms, 10_000) or 0,
                backup=bool(r.field(data, "backup", spath, as_bool, False)),
                down=bool(r.field(data, "down", spath, as_bool, False)),
            )
        else:
            try:
                host, port, sock = parse_address(item)
            except ValueError as exc:
                r.error(spath, str(exc))
                continue
            server = ServerSpec(host=host, port=port, path=sock)
        if any(s.address == server.address for s in out):
            r.error(spath, f"duplicate server {server.address}")
        out.append(server)
    return tuple(out)


MAX_UNIX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


def unix_path(value: str) -> str:
    """The path of ``unix:/path`` (nginx's spelling of a Unix-domain socket server)."""
    path = value[5:]
    raw = path.encode("utf-8", "surrogateescape")
    if not path:
        raise ValueError(f"no path in the unix domain socket {value!r}")
    if "\0" in path:
        raise ValueError(f"a NUL byte in the unix domain socket {value!r}")
    if len(raw) > MAX_UNIX_PATH:
        raise ValueError(f"too long path in the unix domain socket {value!r} (at most {MAX_UNIX_PATH} bytes)")
    return path


_host_port_80 = host_port(default_port=80)


def server_address(value: Any) -> tuple[str, int, str | None]:
    """``host:port`` (port 80 by default) or ``unix:/path``: ``(host, port, path)``."""
    if isinstance(value, str) and value.strip()[:5].lower() == "unix:":
        return "", 0, unix_path(value.strip())
    host, port = _host_port_80(value)
    return host, port, None
