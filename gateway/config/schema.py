"""The configuration file's shape: frozen ``*Spec`` objects and the parser that builds them.

Every problem is reported with its file, line and key path; the parser keeps
going after an error so that one ``gateway check`` shows them all.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from gateway.config.paths import resolve as resolve_pid_path
from gateway.config.reader import (
    Reader,
    as_bool,
    as_str,
    duration_ms,
    host_port,
    int_in,
    network,
    one_of,
    positive_duration_ms,
    size,
    status_code,
    zone_size,
)
from gateway.config.servers import ListenSpec, VirtualServerSpec, bound_addresses, parse_servers
from gateway.config.source import Document
from gateway.config.tls import TLS_KEYS, TlsSpec, parse_tls
from gateway.config.units import PeriodRate, Rate, parse_period_rate, parse_rate
from gateway.config.validate import is_loopback_host, valid_token
from gateway.errors import ConfigErrors, KeyPath
from gateway.http.keys import ADDRESS_VARIABLES, DEFAULT_MAX_KEY, MAX_MAX_KEY, MIN_MAX_KEY, KeyTemplate, parse_key
from gateway.http.realip import Network
from gateway.http.routing import Location, parse_location
from gateway.http.templates import ValueTemplate, parse_body_text, parse_value
from gateway.limits.gcra import MAX_SPAN_NS as GCRA_MAX_SPAN_NS
from gateway.limits.sliding_count import MAX_PRODUCT as SLIDING_MAX_PRODUCT
from gateway.logs.formats import PRESETS, unknown_variables

SLIDING_LOG_MAX = 100_000  # entries per key: the memory a key may cost stays bounded
ZoneType = Literal["req", "count", "conn", "gcra", "sliding_log", "token"]
ALGO_TYPES = ("gcra", "sliding_log", "token")  # zones used only through a route's limits: list
OnError = Literal["local", "allow", "deny"]
LogLevel = Literal["info", "notice", "warn", "error"]
LOG_LEVELS = ("info", "notice", "warn", "error")
NGINX_MIN_ZONE = 32 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSpec:
    host: str
    port: int
    weight: int = 1
    max_fails: int = 1
    fail_timeout_ms: int = 10_000
    backup: bool = False
    down: bool = False

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


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


@dataclass(frozen=True, slots=True, kw_only=True)
class RealIpSpec:
    trusted: tuple[Network, ...] = ()
    header: str = "X-Real-IP"
    recursive: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSpec:
    access: str = "stdout"  # stdout | stderr | off | a file path
    format: str = "combined"  # combined | main | json | a template with $variables
    error: str = "stderr"
    level: LogLevel = "notice"


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeSpec:
    """How the gateway treats client connections (nginx's names and defaults)."""

    worker_connections: int = 10240
    client_header_timeout_ms: int = 60_000
    keepalive_timeout_ms: int = 75_000  # 0: no keep-alive
    send_timeout_ms: int = 60_000
    max_connections_per_ip: int = 256  # 0: no cap (beyond nginx)
    header_buffers: int = 4  # large_client_header_buffers 4 8k
    header_buffer_size: int = 8192
    server_tokens: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminSpec:
    listen: tuple[str, int] | None = ("127.0.0.1", 9180)
    token: str | None = None
    token_file: str | None = None  # None: gateway.admin.token.default_token_path(port)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSpec:
    listen: tuple[str, int] | None = None  # a listener for GET /metrics only, without a token


@dataclass(frozen=True, slots=True, kw_only=True)
class ZoneSpec:
    name: str
    type: ZoneType
    key: KeyTemplate
    size: int = 10 * 1024 * 1024
    rate: Rate | None = None  # req
    ban_s: int = 0  # req
    limit: int = 0  # count
    window_ms: int = 0  # count
    window_type: str = "fixed"  # count: fixed (resty.limit.count) or sliding (APISIX's estimate)
    period_rate: PeriodRate | None = None  # gcra
    burst: int = 0  # gcra (redis-cell's max_burst)
    cost: int = 1  # gcra: units per request, unless cost_var is set
    cost_var: KeyTemplate | None = None  # gcra: cost from a variable such as $http_x_cost
    warmup_ms: int = 0  # token: SmoothWarmingUp's warm-up period (0: SmoothBursty)
    max_delay_ms: int = 0  # token: the longest a request waits for its permit
    max_key: int = DEFAULT_MAX_KEY  # longer keys are hashed to a fixed size
    ipv6_prefix: int = 128  # IPv6 client addresses are masked to this prefix in the key


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitReqSpec:
    zone: str
    burst: int = 0
    delay: int = 0
    nodelay: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitCountSpec:
    zone: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitConnSpec:
    zone: str
    max: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitUseSpec:
    """One entry of a route's generic ``limits:`` list (any zone type, its per-use parameters)."""

    zone: str
    type: ZoneType
    burst: int = 0  # req
    delay: int = 0  # req
    nodelay: bool = False  # req
    max: int = 0  # conn
    cost: int | None = None  # gcra: overrides the zone's cost
    cost_var: KeyTemplate | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteSettings:
    """Settings a route may set itself or inherit from ``defaults`` (None = not set here)."""

    upstream: str | None = None
    client_max_body_size: int | None = None
    client_body_timeout_ms: int | None = None
    limit_req: tuple[LimitReqSpec, ...] | None = None
    limit_count: tuple[LimitCountSpec, ...] | None = None
    limit_conn: tuple[LimitConnSpec, ...] | None = None
    limits: tuple[LimitUseSpec, ...] | None = None
    limit_req_status: int | None = None
    limit_conn_status: int | None = None
    limit_count_status: int | None = None
    limit_req_log_level: LogLevel | None = None
    limit_conn_log_level: LogLevel | None = None
    dry_run: bool | None = None
    ratelimit_headers: bool | None = None
    proxy_request_buffering: bool | None = None
    client_body_buffer_size: int | None = None
    client_body_deadline_ms: int | None = None
    proxy_buffering: bool | None = None
    proxy_buffers: int | None = None
    proxy_max_temp_file_size: int | None = None
    proxy_set_header: tuple[tuple[str, ValueTemplate], ...] | None = None  # empty value: remove the header
    add_header: tuple[AddHeaderSpec, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AddHeaderSpec:
    name: str
    value: ValueTemplate
    always: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ReturnSpec:
    code: int
    url: ValueTemplate | None = None  # 301, 302, 303, 307, 308
    text: ValueTemplate | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteSpec:
    index: int
    location: Location
    settings: RouteSettings
    uri: str | None = None  # proxy_pass's URI part: replaces the matched prefix
    ret: ReturnSpec | None = None  # answer at once, no upstream


@dataclass(frozen=True, slots=True, kw_only=True)
class AccessSpec:
    allow: tuple[Network, ...] = ()
    deny: tuple[Network, ...] = ()
    allow_file: str | None = None  # a blocklist-format file, read at each (re)load
    deny_file: str | None = None
    allow_from_file: tuple[str, ...] = ()  # its canonical CIDRs
    deny_from_file: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class BansSpec:
    status: int = 403
    sync_interval_ms: int = 5_000


@dataclass(frozen=True, slots=True, kw_only=True)
class SentinelSpec:
    master: str
    nodes: tuple[tuple[str, int], ...]
    password: str | None = None
    sentinel_password: str | None = None
    db: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisSpec:
    url: str | None = None
    cluster: tuple[str, ...] = ()
    sentinel: SentinelSpec | None = None
    timeout_ms: int = 50
    on_error: OnError = "local"
    prefix: str = ""
    pool_size: int = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreSpec:
    redis: RedisSpec | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigSpec:
    file: str
    listen: tuple[ListenSpec, ...]  # every address bound (with servers: the union of theirs)
    workers: int  # 0 means "auto": one per core
    shutdown_timeout_ms: int
    edge: EdgeSpec
    real_ip: RealIpSpec
    log: LogSpec
    admin: AdminSpec
    metrics: MetricsSpec = MetricsSpec()
    upstreams: Mapping[str, UpstreamSpec]
    zones: Mapping[str, ZoneSpec]
    defaults: RouteSettings
    routes: tuple[RouteSpec, ...]  # top-level routes (empty with servers:)
    servers: tuple[VirtualServerSpec, ...] = ()  # always at least one once parsed
    access: AccessSpec
    bans: BansSpec
    store: StoreSpec
    temp_path: str | None = None  # request and response bodies that outgrow memory; None = the system's
    pid: str | None = None  # the pid file's absolute path (gateway/runtime/pidfile.py); None: pid off
    warnings: tuple[str, ...] = field(default=())


EDGE_KEYS = (
    "worker_connections",
    "client_header_timeout",
    "keepalive_timeout",
    "send_timeout",
    "max_connections_per_ip",
    "large_client_header_buffers",
    "server_tokens",
)
TOP_KEYS = (
    "listen",
    "workers",
    "shutdown_timeout",
    *EDGE_KEYS,
    "real_ip",
    "log",
    "admin",
    "metrics",
    "upstreams",
    "zones",
    "defaults",
    "routes",
    "servers",
    "access",
    "bans",
    "store",
    "temp_path",
    *TLS_KEYS,
    "pid",
)
ROUTE_SETTING_KEYS = (
    "upstream",
    "client_max_body_size",
    "client_body_timeout",
    "limit_req",
    "limit_count",
    "limit_conn",
    "limits",
    "limit_req_status",
    "limit_conn_status",
    "limit_count_status",
    "limit_req_log_level",
    "limit_conn_log_level",
    "dry_run",
    "ratelimit_headers",
    "proxy_request_buffering",
    "client_body_buffer_size",
    "client_body_deadline",
    "proxy_buffering",
    "proxy_buffers",
    "proxy_max_temp_file_size",
    "proxy_set_header",
    "add_header",
)
ROUTE_ONLY_KEYS = ("location", "uri", "return")
REDIRECT_CODES = (301, 302, 303, 307, 308)


def parse_config(doc: Document) -> ConfigSpec:
    """Validate a whole document; raise ``ConfigErrors`` listing every problem."""
    r = Reader(doc)
    data = r.mapping(doc.data, (), TOP_KEYS, what="a mapping at the top level")
    if data is None:
        raise ConfigErrors(r.errors)
    if "routes" in data and "servers" in data:
        r.error(("servers",), "use either routes (one server) or servers (virtual hosts), not both", at_key=True)
    elif "routes" not in data and "servers" not in data:
        r.error((), "missing required key 'routes'")

    listen = _listen(r, data)
    workers = _workers(r, data)
    shutdown_ms = r.field(data, "shutdown_timeout", (), duration_ms, 30_000)
    upstreams = _upstreams(r, data.get("upstreams"), ("upstreams",)) if "upstreams" in data else {}
    zones = _zones(r, data.get("zones"), ("zones",)) if "zones" in data else ZoneTable()
    defaults = (
        _settings(r, data["defaults"], ("defaults",), zones, upstreams, allowed=ROUTE_SETTING_KEYS)
        if "defaults" in data
        else RouteSettings()
    )
    routes = _routes(r, data["routes"], zones, upstreams, defaults) if "routes" in data else ()
    tls = parse_tls(r, data, ())
    if "servers" in data:
        servers = parse_servers(
            r,
            data["servers"],
            listen,
            lambda value, path: _listen_list(r, value, path),
            lambda value, path: _routes(r, value, zones, upstreams, defaults, path),
            lambda server, path: parse_tls(r, server, path, tls),
            TLS_KEYS,
        )
        listen = bound_addresses(servers)
    else:
        servers = (VirtualServerSpec(index=0, names=(), listen=listen, default=True, routes=routes, tls=tls),)
    _check_tls(r, servers, "servers" in data)
    admin = _admin(r, data.get("admin"), ("admin",)) if "admin" in data else AdminSpec()
    spec = ConfigSpec(
        file=doc.file,
        listen=listen,
        servers=servers,
        workers=workers,
        shutdown_timeout_ms=shutdown_ms or 0,
        edge=_edge(r, data),
        real_ip=_real_ip(r, data.get("real_ip"), ("real_ip",)) if "real_ip" in data else RealIpSpec(),
        log=_log(r, data.get("log"), ("log",)) if "log" in data else LogSpec(),
        admin=admin,
        metrics=_metrics(r, data.get("metrics"), ("metrics",), admin, listen) if "metrics" in data else MetricsSpec(),
        upstreams=MappingProxyType(upstreams),
        zones=MappingProxyType(zones),
        defaults=defaults,
        routes=routes,
        access=_access(r, data.get("access"), ("access",)) if "access" in data else AccessSpec(),
        bans=_bans(r, data.get("bans"), ("bans",)) if "bans" in data else BansSpec(),
        store=_store(r, data.get("store"), ("store",)) if "store" in data else StoreSpec(),
        temp_path=r.field(data, "temp_path", (), _temp_path, None),
        pid=_pid(r, data, doc.file),
        warnings=tuple(str(w) for w in r.warnings),
    )
    if r.errors:
        raise ConfigErrors(r.errors)
    return spec


# -- listeners and processes -----------------------------------------------------------------


def _listen(r: Reader, data: dict[str, Any]) -> tuple[ListenSpec, ...]:
    if "listen" not in data:
        return (ListenSpec("0.0.0.0", 8080),)
    return _listen_list(r, data["listen"], ("listen",))


def _listen_list(r: Reader, value: Any, at: KeyPath) -> tuple[ListenSpec, ...]:
    out: list[ListenSpec] = []
    for i, item in enumerate(r.sequence(value, at, allow_scalar=True)):
        path: KeyPath = at + (i,) if isinstance(value, list) else at
        entry = _listen_entry(r, item, path)
        if entry is None:
            continue
        if any(e.address == entry.address for e in out):
            r.error(path, f"duplicate listen {entry.host}:{entry.port}")
        out.append(entry)
    if not out and not r.errors:
        r.error(at, "at least one listen address is required")
    return tuple(out)


def _listen_entry(r: Reader, item: Any, path: KeyPath) -> ListenSpec | None:
    """``host:port``, ``"host:port ssl"`` (nginx's spelling) or ``{address: host:port, ssl: true}``."""
    tls = False
    if isinstance(item, dict):
        data = r.mapping(item, path, ("address", "ssl"), required=("address",))
        if data is None or "address" not in data:
            return None
        tls = bool(r.field(data, "ssl", path, as_bool, False))
        item, path = data["address"], path + ("address",)
    elif isinstance(item, str) and item.split()[1:] == ["ssl"]:
        item, tls = item.split()[0], True
    try:
        host, port = host_port()(item)
    except ValueError as exc:
        r.error(path, str(exc))
        return None
    return ListenSpec(host, port, tls)


def _check_tls(r: Reader, servers: tuple[VirtualServerSpec, ...], blocks: bool) -> None:
    """Every server that listens with ``ssl`` has a certificate to serve."""
    for server in servers:
        tls: TlsSpec | None = server.tls
        if not any(entry.ssl for entry in server.listen) or tls is None:
            continue
        if tls.certificate is None or tls.key is None:
            where: KeyPath = ("servers", server.index, "listen") if blocks else ("listen",)
            r.error(where, "a listen with ssl needs ssl_certificate and ssl_certificate_key (at the top level or here)")


def _pid(r: Reader, data: dict[str, Any], config_file: str) -> str | None:
    """``pid: PATH`` (relative: to the config file's directory), ``pid: off``, or the default."""
    value = data.get("pid")
    if value is False or value == "off":  # YAML reads a bare `off` as false
        return None
    if value is not None and (not isinstance(value, str) or not value.strip()):
        r.error(("pid",), "must be a file path, or off")
        return None
    return resolve_pid_path(value, config_file)


def _workers(r: Reader, data: dict[str, Any]) -> int:
    value = data.get("workers", 1)
    if value == "auto":
        return 0
    try:
        return int_in(1, 512, "number of workers")(value)
    except ValueError as exc:
        r.error(("workers",), f'{exc} (or "auto")')
        return 1


def _edge(r: Reader, data: dict[str, Any]) -> EdgeSpec:
    d = EdgeSpec()
    buffers, buffer_size = d.header_buffers, d.header_buffer_size
    if "large_client_header_buffers" in data:
        parsed = r.field(data, "large_client_header_buffers", (), _header_buffers)
        if parsed is not None:
            buffers, buffer_size = parsed
    return EdgeSpec(
        worker_connections=r.field(
            data, "worker_connections", (), int_in(16, 1_000_000, "worker_connections"), d.worker_connections
        )
        or d.worker_connections,
        client_header_timeout_ms=r.field(
            data, "client_header_timeout", (), positive_duration_ms, d.client_header_timeout_ms
        )
        or d.client_header_timeout_ms,
        keepalive_timeout_ms=r.field(data, "keepalive_timeout", (), duration_ms, d.keepalive_timeout_ms) or 0,
        send_timeout_ms=r.field(data, "send_timeout", (), positive_duration_ms, d.send_timeout_ms) or d.send_timeout_ms,
        max_connections_per_ip=r.field(
            data, "max_connections_per_ip", (), int_in(0, 1_000_000, "max_connections_per_ip"), 256
        )
        or 0,
        header_buffers=buffers,
        header_buffer_size=buffer_size,
        server_tokens=bool(r.field(data, "server_tokens", (), as_bool, False)),
    )


def _header_buffers(value: Any) -> tuple[int, int]:
    """nginx's ``large_client_header_buffers number size``, e.g. ``4 8k``."""
    parts = str(value).split() if isinstance(value, str) else []
    if len(parts) != 2 or not parts[0].isdigit():
        raise ValueError(f'expected "<number> <size>" such as "4 8k", got {value!r}')
    number = int(parts[0])
    buffer_size = size(parts[1])
    if not 1 <= number <= 64:
        raise ValueError(f"invalid number of buffers {number}: must be between 1 and 64")
    if not 1024 <= buffer_size <= 1024 * 1024:
        raise ValueError(f"invalid buffer size {parts[1]}: must be between 1k and 1m")
    return number, buffer_size


# -- real_ip, log, admin ---------------------------------------------------------------------


def _networks(r: Reader, value: Any, path: KeyPath) -> tuple[Network, ...]:
    out: list[Network] = []
    for i, item in enumerate(r.sequence(value, path, allow_scalar=True)):
        try:
            out.append(network(item))
        except ValueError as exc:
            r.error(path + (i,) if isinstance(value, list) else path, str(exc))
    return tuple(out)


def _real_ip(r: Reader, value: Any, path: KeyPath) -> RealIpSpec:
    data = r.mapping(value, path, ("from", "header", "recursive"))
    if data is None:
        return RealIpSpec()
    header = r.field(data, "header", path, as_str, "X-Real-IP") or "X-Real-IP"
    if any(c in header for c in " :\t"):
        r.error(path + ("header",), f"invalid header name {header!r}")
    return RealIpSpec(
        trusted=_networks(r, data["from"], path + ("from",)) if "from" in data else (),
        header=header,
        recursive=bool(r.field(data, "recursive", path, as_bool, False)),
    )


def _log(r: Reader, value: Any, path: KeyPath) -> LogSpec:
    data = r.mapping(value, path, ("access", "format", "error", "level"))
    if data is None:
        return LogSpec()
    fmt = r.field(data, "format", path, as_str, "combined") or "combined"
    unknown = unknown_variables(fmt) if fmt not in PRESETS and fmt != "json" else []
    if unknown:
        r.error(path + ("format",), f'unknown log variable "${unknown[0]}"')
    elif fmt not in ("combined", "main", "gateway", "json") and "$" not in fmt:
        r.error(
            path + ("format",),
            f"unknown log format {fmt!r}: use combined, main, gateway, json or a template with $variables",
        )
    return LogSpec(
        access=r.field(data, "access", path, _log_target, "stdout") or "stdout",
        format=fmt,
        error=r.field(data, "error", path, _log_target, "stderr") or "stderr",
        level=r.field(data, "level", path, one_of(*LOG_LEVELS), "notice") or "notice",  # type: ignore[arg-type]
    )


def _log_target(value: Any) -> str:
    if value is False:  # YAML reads a bare `off` as false
        return "off"
    return as_str(value)


def _admin(r: Reader, value: Any, path: KeyPath) -> AdminSpec:
    data = r.mapping(value, path, ("listen", "token", "token_file"))
    if data is None:
        return AdminSpec()
    listen: tuple[str, int] | None = ("127.0.0.1", 9180)
    if data.get("listen") in (False, "off"):
        listen = None
    elif "listen" in data:
        listen = r.field(data, "listen", path, host_port())
    token = r.field(data, "token", path, as_str, None)
    if token is not None and token.startswith("$"):
        token = os.environ.get(token[1:]) or None
        if token is None:
            r.error(path + ("token",), f"environment variable {data['token'][1:]} is not set")
    if token is not None and not valid_token(token):
        r.error(path + ("token",), "the token must be visible ASCII characters, without spaces")
    token_file = r.field(data, "token_file", path, as_str, None)
    if token_file is not None and not os.path.isabs(token_file):
        r.error(path + ("token_file",), "must be an absolute path (the CLI reads it from another directory)")
    if listen is not None and "token" not in data and not is_loopback_host(listen[0]):
        host = f"[{listen[0]}]" if ":" in listen[0] else listen[0]
        r.error(
            path + ("listen",),
            f"{host}:{listen[1]} is not a loopback address: an admin API reachable from other machines "
            "needs admin.token",
        )
    return AdminSpec(listen=listen, token=token, token_file=token_file)


def _metrics(r: Reader, value: Any, path: KeyPath, admin: AdminSpec, listen: tuple[ListenSpec, ...]) -> MetricsSpec:
    data = r.mapping(value, path, ("listen",))
    if data is None:
        return MetricsSpec()
    if data.get("listen") in (None, False, "off"):
        return MetricsSpec()
    address = r.field(data, "listen", path, host_port())
    if address is None:
        return MetricsSpec()
    bound = {entry.address for entry in listen}
    taken = "admin.listen" if address == admin.listen else "listen" if address in bound else None
    if taken is not None:
        r.error(path + ("listen",), f"{address[0]}:{address[1]} is already used by {taken}")
    return MetricsSpec(listen=address)


# -- upstreams --------------------------------------------------------------------------------

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
)
SERVER_KEYS = ("address", "weight", "max_fails", "fail_timeout", "backup", "down")


def _upstreams(r: Reader, value: Any, path: KeyPath) -> dict[str, UpstreamSpec]:
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
        )
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
        with open(path, "rb") as fh:
            text = fh.read()
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
    parse_address = host_port(default_port=80)
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
                weight=r.field(data, "weight", spath, int_in(1, 1000, "weight"), 1) or 1,
                max_fails=r.field(data, "max_fails", spath, int_in(0, 1000, "max_fails"), 1) or 0,
                fail_timeout_ms=r.field(data, "fail_timeout", spath, duration_ms, 10_000) or 0,
                backup=bool(r.field(data, "backup", spath, as_bool, False)),
                down=bool(r.field(data, "down", spath, as_bool, False)),
            )
        else:
            try:
                host, port = parse_address(item)
            except ValueError as exc:
                r.error(spath, str(exc))
                continue
            server = ServerSpec(host=host, port=port)
        if any(s.host == server.host and s.port == server.port for s in out):
            r.error(spath, f"duplicate server {server.address}")
        out.append(server)
    return tuple(out)


# -- zones ------------------------------------------------------------------------------------

ZONE_KEYS = {
    "req": ("type", "key", "rate", "ban", "size", "max_key", "ipv6_prefix"),
    "count": ("type", "key", "limit", "window", "window_type", "size", "max_key", "ipv6_prefix"),
    "conn": ("type", "key", "size", "max_key", "ipv6_prefix"),
    "gcra": ("type", "key", "rate", "burst", "cost", "size", "max_key", "ipv6_prefix"),
    "sliding_log": ("type", "key", "limit", "window", "size", "max_key", "ipv6_prefix"),
    "token": ("type", "key", "rate", "warmup", "max_delay", "size", "max_key", "ipv6_prefix"),
}
ZONE_REQUIRED = {
    "req": ("key", "rate"),
    "count": ("key", "limit", "window"),
    "conn": ("key",),
    "gcra": ("key", "rate"),
    "sliding_log": ("key", "limit", "window"),
    "token": ("key", "rate"),
}


class ZoneTable(dict[str, ZoneSpec]):
    """The zones that were built, and the names of those declared but refused: a route that
    uses a refused zone is not reported again ("unknown zone"): its root cause already was."""

    refused: frozenset[str] = frozenset()


def _zones(r: Reader, value: Any, path: KeyPath) -> ZoneTable:
    out = ZoneTable()
    if not isinstance(value, dict):
        r.error(path, "expected a mapping of zone names to zones")
        return out
    out.refused = frozenset(str(name) for name in value)  # until each is built
    for name, body in value.items():
        zpath = path + (name,)
        if not isinstance(body, dict):
            r.error(zpath, "expected a mapping with type, key and the zone's parameters")
            continue
        ztype = body.get("type")
        if not isinstance(ztype, str) or ztype not in ZONE_KEYS:
            r.error(
                zpath + ("type",) if "type" in body else zpath,
                f"zone type must be req, count, conn, gcra, sliding_log or token, got {ztype!r}"
                if "type" in body
                else "missing required key 'type' (req, count, conn, gcra, sliding_log or token)",
            )
            continue
        data = r.mapping(body, zpath, ZONE_KEYS[ztype], required=ZONE_REQUIRED[ztype])
        if data is None:
            continue
        key = r.field(data, "key", zpath, parse_key)
        zone_bytes = r.field(data, "size", zpath, zone_size, 10 * 1024 * 1024)
        if zone_bytes is not None and zone_bytes < NGINX_MIN_ZONE:
            r.error(zpath + ("size",), f'zone "{name}" is too small: at least 32k, like nginx')
        rate = r.field(data, "rate", zpath, parse_rate) if ztype == "req" else None
        ban_ms = r.field(data, "ban", zpath, duration_ms, 0) if ztype == "req" else 0
        if ban_ms and ban_ms % 1000:
            r.error(zpath + ("ban",), "ban is kept in whole seconds (it becomes a Redis EXPIRE)")
        counted = ztype in ("count", "sliding_log")
        log_max = SLIDING_LOG_MAX if ztype == "sliding_log" else 2**31 - 1
        limit = r.field(data, "limit", zpath, int_in(1, log_max, "limit")) if counted else 0
        window = r.field(data, "window", zpath, positive_duration_ms) if counted else 0
        max_key = r.field(data, "max_key", zpath, int_in(MIN_MAX_KEY, MAX_MAX_KEY, "max_key"), DEFAULT_MAX_KEY)
        ipv6_prefix = r.field(data, "ipv6_prefix", zpath, int_in(1, 128, "ipv6_prefix"), 128)
        if ipv6_prefix != 128 and key is not None and not set(key.variables) & set(ADDRESS_VARIABLES):
            r.error(
                zpath + ("ipv6_prefix",),
                "ipv6_prefix only changes $binary_remote_addr and $remote_addr, and the key uses neither",
            )
        if key is None or zone_bytes is None or max_key is None or ipv6_prefix is None:
            continue
        if ztype == "req" and rate is None:
            continue
        if counted and (limit is None or window is None):
            continue
        window_type = (
            r.field(data, "window_type", zpath, one_of("fixed", "sliding"), "fixed") if ztype == "count" else None
        )
        if window_type == "sliding" and (limit or 0) * (window or 0) > SLIDING_MAX_PRODUCT:
            r.error(zpath + ("window",), "limit x window (in ms) must stay under 2^53 for a sliding window")
            continue
        algo = _algo_zone(r, data, zpath, ztype)
        if algo is None:
            continue
        out[name] = ZoneSpec(
            name=name,
            type=ztype,  # type: ignore[arg-type]  # checked against ZONE_KEYS above
            key=key,
            size=zone_bytes,
            rate=rate,
            ban_s=(ban_ms or 0) // 1000,
            limit=limit or 0,
            window_ms=window or 0,
            window_type=window_type or "fixed",
            **algo,
            max_key=max_key,
            ipv6_prefix=ipv6_prefix,
        )
    out.refused = frozenset(name for name in out.refused if name not in out)
    return out


def _algo_zone(r: Reader, data: dict[str, Any], zpath: KeyPath, ztype: str) -> dict[str, Any] | None:
    """The parameters of a gcra zone ({} for the other types; None when one is invalid)."""
    if ztype not in ALGO_TYPES or ztype == "sliding_log":
        return {}
    if ztype == "token":
        return _token_zone(r, data, zpath)
    rate = r.field(data, "rate", zpath, parse_period_rate)
    burst = r.field(data, "burst", zpath, int_in(0, MAX_BURST, "burst"), 0)
    cost = r.field(data, "cost", zpath, _cost, {"cost": 1})
    if rate is None or burst is None or cost is None:
        return None
    if rate.count > rate.period_s * 1_000_000:
        r.error(zpath + ("rate",), "a gcra rate is at most 1000000r/s (one request per microsecond)")
        return None
    if int(rate.period_s * 1e9 / rate.count) * (burst + 1) > GCRA_MAX_SPAN_NS:
        r.error(zpath + ("burst",), "burst + 1 requests at this rate span more than 104 days; lower burst")
        return None
    out: dict[str, Any] = {"period_rate": rate, "burst": burst}
    out.update(cost)
    return out


def _token_zone(r: Reader, data: dict[str, Any], zpath: KeyPath) -> dict[str, Any] | None:
    rate = r.field(data, "rate", zpath, parse_period_rate)
    warmup = r.field(data, "warmup", zpath, duration_ms, 0)
    max_delay = r.field(data, "max_delay", zpath, duration_ms, 0)
    if rate is None or warmup is None or max_delay is None:
        return None
    if rate.count > rate.period_s * 1_000_000:
        r.error(zpath + ("rate",), "a token rate is at most 1000000r/s")
        return None
    if warmup > 86_400_000 or max_delay > 3_600_000:
        r.error(zpath, "warmup is at most 1d and max_delay at most 1h")
        return None
    return {"period_rate": rate, "warmup_ms": warmup, "max_delay_ms": max_delay}


def _cost(value: Any) -> dict[str, Any]:
    """``cost``: a whole number of units (0 peeks), or a variable such as ``$http_x_cost``."""
    if isinstance(value, str) and value.startswith("$"):
        return {"cost_var": parse_key(value)}
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BURST:
        raise ValueError(f"invalid cost {value!r}: a whole number from 0 to {MAX_BURST}, or a variable")
    return {"cost": value}


# -- routes -----------------------------------------------------------------------------------


def _routes(
    r: Reader,
    value: Any,
    zones: Mapping[str, ZoneSpec],
    upstreams: Mapping[str, UpstreamSpec],
    defaults: RouteSettings,
    at: KeyPath = ("routes",),
) -> tuple[RouteSpec, ...]:
    items = r.sequence(value, at)
    out: list[RouteSpec] = []
    seen: dict[tuple[str, str], int] = {}
    for i, item in enumerate(items):
        path: KeyPath = at + (i,)
        data = r.mapping(item, path, ROUTE_ONLY_KEYS + ROUTE_SETTING_KEYS, required=("location",))
        if data is None or "location" not in data:
            continue
        location = r.field(data, "location", path, parse_location)
        settings = _settings(r, data, path, zones, upstreams, allowed=None)
        if location is None:
            continue
        ident = (location.kind if location.kind != "prefix_noregex" else "prefix", location.value)
        if ident in seen:
            r.error(path + ("location",), f'duplicate location "{location.value}" (first at {at[-1]}[{seen[ident]}])')
        seen[ident] = i
        ret = _return(r, data["return"], path + ("return",)) if "return" in data else None
        uri = r.field(data, "uri", path, _uri, None)
        if uri is not None and location.kind in ("regex", "regex_icase"):
            r.error(path + ("uri",), "a uri cannot be given for a location given by regular expression (as in nginx)")
        if ret is not None and (uri is not None or settings.upstream is not None):
            r.error(path + ("return",), "a route with return answers itself: it has no upstream nor uri")
        if "return" not in data and settings.upstream is None and defaults.upstream is None:
            r.error(path, "missing required key 'upstream' (set it here or in defaults)")
        out.append(RouteSpec(index=i, location=location, settings=settings, uri=uri, ret=ret))
    if isinstance(value, list) and not items:
        r.error(at, "at least one route is required")
    return tuple(out)


def _settings(
    r: Reader,
    data: Any,
    path: KeyPath,
    zones: Mapping[str, ZoneSpec],
    upstreams: Mapping[str, UpstreamSpec],
    allowed: tuple[str, ...] | None,
) -> RouteSettings:
    if allowed is not None:
        data = r.mapping(data, path, allowed)
        if data is None:
            return RouteSettings()
    upstream = r.field(data, "upstream", path, as_str, None)
    if upstream is not None and upstream not in upstreams:
        r.error(path + ("upstream",), f'unknown upstream "{upstream}"')
    if isinstance(data.get("limits"), list):
        _no_zone_twice(r, data, path)
    return RouteSettings(
        upstream=upstream,
        client_max_body_size=r.field(data, "client_max_body_size", path, size, None),
        client_body_timeout_ms=r.field(data, "client_body_timeout", path, positive_duration_ms, None),
        limit_req=_limit_req(r, data["limit_req"], path + ("limit_req",), zones) if "limit_req" in data else None,
        limit_count=_limit_count(r, data["limit_count"], path + ("limit_count",), zones)
        if "limit_count" in data
        else None,
        limit_conn=_limit_conn(r, data["limit_conn"], path + ("limit_conn",), zones) if "limit_conn" in data else None,
        limits=_limits(r, data["limits"], path + ("limits",), zones) if "limits" in data else None,
        limit_req_status=r.field(data, "limit_req_status", path, status_code, None),
        limit_conn_status=r.field(data, "limit_conn_status", path, status_code, None),
        limit_count_status=r.field(data, "limit_count_status", path, status_code, None),
        limit_req_log_level=r.field(data, "limit_req_log_level", path, one_of(*LOG_LEVELS), None),  # type: ignore[arg-type]
        limit_conn_log_level=r.field(data, "limit_conn_log_level", path, one_of(*LOG_LEVELS), None),  # type: ignore[arg-type]
        dry_run=r.field(data, "dry_run", path, as_bool, None),
        ratelimit_headers=r.field(data, "ratelimit_headers", path, as_bool, None),
        proxy_request_buffering=r.field(data, "proxy_request_buffering", path, _on_off, None),
        client_body_buffer_size=r.field(data, "client_body_buffer_size", path, size, None),
        client_body_deadline_ms=r.field(data, "client_body_deadline", path, duration_ms, None),
        proxy_buffering=r.field(data, "proxy_buffering", path, _on_off, None),
        proxy_buffers=r.field(data, "proxy_buffers", path, _proxy_buffers, None),
        proxy_max_temp_file_size=r.field(data, "proxy_max_temp_file_size", path, size, None),
        proxy_set_header=_proxy_set_header(r, data["proxy_set_header"], path + ("proxy_set_header",))
        if "proxy_set_header" in data
        else None,
        add_header=_add_header(r, data["add_header"], path + ("add_header",)) if "add_header" in data else None,
    )


def _uri(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"expected a URI path starting with '/', such as /v1/, got {value!r}")
    if any(c <= " " or c == "\x7f" for c in value) or "$" in value or "#" in value:
        raise ValueError("a uri cannot contain spaces, control characters, '#' or variables")
    return value


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _header_name(value: Any) -> str:
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise ValueError(f"expected a header name (an HTTP token), got {value!r}")
    return value


def _proxy_set_header(r: Reader, value: Any, path: KeyPath) -> tuple[tuple[str, ValueTemplate], ...]:
    if not isinstance(value, dict):
        r.error(path, "expected a mapping of header names to values (an empty value removes the header)")
        return ()
    out: list[tuple[str, ValueTemplate]] = []
    for name, text in value.items():
        try:
            out.append((_header_name(name), parse_value("" if text is None else text)))
        except ValueError as exc:
            r.error(path + (str(name),), str(exc))
    return tuple(out)


def _add_header(r: Reader, value: Any, path: KeyPath) -> tuple[AddHeaderSpec, ...]:
    out: list[AddHeaderSpec] = []
    for i, item in enumerate(r.sequence(value, path)):
        data = r.mapping(item, path + (i,), ("name", "value", "always"), required=("name", "value"))
        if data is None or "name" not in data or "value" not in data:
            continue
        name = r.field(data, "name", path + (i,), _header_name, None)
        text = r.field(data, "value", path + (i,), parse_value, None)
        always = r.field(data, "always", path + (i,), as_bool, False)
        if name is not None and text is not None:
            out.append(AddHeaderSpec(name=name, value=text, always=bool(always)))
    return tuple(out)


def _return(r: Reader, value: Any, path: KeyPath) -> ReturnSpec | None:
    data = r.mapping(value, path, ("code", "url", "text"), required=("code",))
    if data is None or "code" not in data:
        return None
    code = r.field(data, "code", path, int_in(200, 599, "status code"), None)
    url = r.field(data, "url", path, parse_value, None)
    text = r.field(data, "text", path, parse_body_text, None)
    if code is None:
        return None
    if url is not None and code not in REDIRECT_CODES:
        r.error(path + ("url",), f"url goes with a redirect code ({', '.join(map(str, REDIRECT_CODES))}), not {code}")
        return None
    if code in REDIRECT_CODES and url is None:
        r.error(path, f"a {code} return needs a url")
        return None
    if url is not None and text is not None:
        r.error(path, "a return has a url or a text, not both")
        return None
    return ReturnSpec(code=code, url=url, text=text)


def _on_off(value: Any) -> bool:
    """nginx's on|off (YAML reads bare on/off as booleans already)."""
    if value in ("on", "off"):
        return bool(value == "on")
    if not isinstance(value, bool):
        raise ValueError(f"expected on or off, got {value!r}")
    return value


def _proxy_buffers(value: Any) -> int:
    """Bytes of memory for one response: a size (``64k``) or nginx's ``number size`` (``8 8k``)."""
    if isinstance(value, str) and len(value.split()) == 2:
        count, each = value.split()
        if not count.isdigit():
            raise ValueError(f"invalid proxy_buffers {value!r}: use a size (64k) or a number and a size (8 8k)")
        total = int(count) * size(each)
    else:
        total = size(value)
    if total <= 0:
        raise ValueError("proxy_buffers must be more than 0 bytes")
    return total


def _temp_path(value: Any) -> str:
    path = as_str(value)
    try:
        usable = os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)
    except ValueError:  # a NUL byte
        usable = False
    if not usable:
        raise ValueError(f"temp_path {path!r} is not an existing directory this process can write to")
    return path


def _refused(zones: Mapping[str, ZoneSpec], name: str) -> bool:
    return isinstance(zones, ZoneTable) and name in zones.refused


def _zone_ref(
    r: Reader, data: dict[str, Any], path: KeyPath, zones: Mapping[str, ZoneSpec], kind: str, seen: set[str]
) -> str | None:
    name = r.field(data, "zone", path, as_str)
    if name is None:
        return None
    zone = zones.get(name)
    if zone is None:
        if not _refused(zones, name):
            r.error(path + ("zone",), f'unknown zone "{name}"')
        return None
    if zone.type != kind:
        r.error(path + ("zone",), f'zone "{name}" is a {zone.type} zone, not a {kind} zone')
        return None
    if name in seen:
        r.error(
            path + ("zone",), f'zone "{name}" is used twice in one list (nginx: "limit_{kind}" directive is duplicate)'
        )
        return None
    seen.add(name)
    return name


def _limit_req(r: Reader, value: Any, path: KeyPath, zones: Mapping[str, ZoneSpec]) -> tuple[LimitReqSpec, ...]:
    out: list[LimitReqSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(r.sequence(value, path)):
        ipath = path + (i,)
        data = r.mapping(item, ipath, ("zone", "burst", "delay", "nodelay"), required=("zone",))
        if data is None:
            continue
        name = _zone_ref(r, data, ipath, zones, "req", seen)
        burst = r.field(data, "burst", ipath, _positive("burst"), 0)
        delay = r.field(data, "delay", ipath, _positive("delay"), 0)
        nodelay = r.field(data, "nodelay", ipath, as_bool, False)
        if nodelay and "delay" in data:
            r.error(ipath, "use either nodelay or delay, not both")
        if name is not None and burst is not None and delay is not None:
            out.append(LimitReqSpec(zone=name, burst=burst, delay=delay, nodelay=bool(nodelay)))
    return tuple(out)


MAX_BURST = 2**31 - 1  # burst and delay: x1000 they stay exact in the 42 bits of excess


def _positive(what: str) -> Any:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f'invalid {what} value "{value}": must be an integer greater than zero (omit it for 0)')
        if value > MAX_BURST:
            raise ValueError(f"invalid {what} value {value}: at most {MAX_BURST}")
        return value

    return parse


def _limit_count(r: Reader, value: Any, path: KeyPath, zones: Mapping[str, ZoneSpec]) -> tuple[LimitCountSpec, ...]:
    out: list[LimitCountSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(r.sequence(value, path)):
        data = r.mapping(item, path + (i,), ("zone",), required=("zone",))
        if data is None:
            continue
        name = _zone_ref(r, data, path + (i,), zones, "count", seen)
        if name is not None:
            out.append(LimitCountSpec(zone=name))
    return tuple(out)


def _limit_conn(r: Reader, value: Any, path: KeyPath, zones: Mapping[str, ZoneSpec]) -> tuple[LimitConnSpec, ...]:
    out: list[LimitConnSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(r.sequence(value, path)):
        ipath = path + (i,)
        data = r.mapping(item, ipath, ("zone", "max"), required=("zone", "max"))
        if data is None:
            continue
        name = _zone_ref(r, data, ipath, zones, "conn", seen)
        limit = r.field(data, "max", ipath, int_in(1, 65535, "number of connections"))
        if name is not None and limit is not None:
            out.append(LimitConnSpec(zone=name, max=limit))
    return tuple(out)


def _no_zone_twice(r: Reader, data: dict[str, Any], path: KeyPath) -> None:
    """A zone in ``limits:`` and in a ``limit_*`` list of the same route would be charged twice."""
    named = set()
    for kind in ("limit_req", "limit_count", "limit_conn"):
        for item in data.get(kind) or ():
            if isinstance(item, dict) and isinstance(item.get("zone"), str):
                named.add(item["zone"])
    for i, item in enumerate(data["limits"]):
        if isinstance(item, dict) and item.get("zone") in named:
            r.error(path + ("limits", i, "zone"), f'zone "{item["zone"]}" is also in a limit_* list of this route')


LIMIT_USE_KEYS = {
    "req": ("zone", "burst", "delay", "nodelay"),
    "count": ("zone",),
    "conn": ("zone", "max"),
    "gcra": ("zone", "cost"),
    "sliding_log": ("zone",),
    "token": ("zone",),
}


def _limits(r: Reader, value: Any, path: KeyPath, zones: Mapping[str, ZoneSpec]) -> tuple[LimitUseSpec, ...]:
    """The generic ordered list: ``[{zone: name, ...its per-use parameters}]``, any zone type."""
    out: list[LimitUseSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(r.sequence(value, path)):
        ipath = path + (i,)
        if not isinstance(item, dict) or not isinstance(item.get("zone"), str):
            r.error(ipath, "expected a mapping with a zone and its per-use parameters")
            continue
        zone = zones.get(item["zone"])
        if zone is None:
            if not _refused(zones, item["zone"]):
                r.error(ipath + ("zone",), f'unknown zone "{item["zone"]}"')
            continue
        required = ("zone", "max") if zone.type == "conn" else ("zone",)
        data = r.mapping(item, ipath, LIMIT_USE_KEYS[zone.type], required=required)
        if data is None:
            continue
        name = _zone_ref(r, data, ipath, zones, zone.type, seen)
        burst = r.field(data, "burst", ipath, _positive("burst"), 0)
        delay = r.field(data, "delay", ipath, _positive("delay"), 0)
        nodelay = r.field(data, "nodelay", ipath, as_bool, False)
        if nodelay and "delay" in data:
            r.error(ipath, "use either nodelay or delay, not both")
        limit = r.field(data, "max", ipath, int_in(1, 65535, "number of connections"), 0)
        cost = r.field(data, "cost", ipath, _cost, {})
        if name is None or burst is None or delay is None or limit is None or cost is None:
            continue
        out.append(
            LimitUseSpec(zone=name, type=zone.type, burst=burst, delay=delay, nodelay=bool(nodelay), max=limit, **cost)
        )
    return tuple(out)


# -- access, bans, store ----------------------------------------------------------------------


def _access(r: Reader, value: Any, path: KeyPath) -> AccessSpec:
    data = r.mapping(value, path, ("allow", "deny", "allow_file", "deny_file"))
    if data is None:
        return AccessSpec()
    allow_file = r.field(data, "allow_file", path, as_str, None)
    deny_file = r.field(data, "deny_file", path, as_str, None)
    return AccessSpec(
        allow=_networks(r, data["allow"], path + ("allow",)) if "allow" in data else (),
        deny=_networks(r, data["deny"], path + ("deny",)) if "deny" in data else (),
        allow_file=allow_file,
        deny_file=deny_file,
        allow_from_file=_network_file(r, allow_file, path + ("allow_file",)) if allow_file else (),
        deny_from_file=_network_file(r, deny_file, path + ("deny_file",)) if deny_file else (),
    )


def _network_file(r: Reader, name: str, path: KeyPath) -> tuple[str, ...]:
    """The CIDRs of a blocklist-format file (relative to the configuration file); errors name file:line."""
    from gateway.bans.blocklist import MAX_ERRORS_SHOWN, read_blocklist

    if not os.path.isabs(name) and r.doc.file and not r.doc.file.startswith("<"):
        name = os.path.join(os.path.dirname(os.path.abspath(r.doc.file)), name)
    try:
        found = read_blocklist(name)
    except OSError as exc:
        r.error(path, f"cannot read {name}: {exc.strerror or exc}")
        return ()
    for number, problem in found.errors[:MAX_ERRORS_SHOWN]:
        r.error(path, f"{name}:{number}: {problem}")
    if len(found.errors) > MAX_ERRORS_SHOWN:
        r.error(path, f"{name}: {len(found.errors) - MAX_ERRORS_SHOWN} more lines are not addresses")
    return tuple(target for _, target in found.targets)


def _bans(r: Reader, value: Any, path: KeyPath) -> BansSpec:
    data = r.mapping(value, path, ("status", "sync_interval"))
    if data is None:
        return BansSpec()
    return BansSpec(
        status=r.field(data, "status", path, status_code, 403) or 403,
        sync_interval_ms=r.field(data, "sync_interval", path, positive_duration_ms, 5_000) or 5_000,
    )


def _store(r: Reader, value: Any, path: KeyPath) -> StoreSpec:
    data = r.mapping(value, path, ("redis",))
    if data is None or data.get("redis") is None:
        return StoreSpec()
    rpath = path + ("redis",)
    redis = r.mapping(
        data["redis"], rpath, ("url", "cluster", "sentinel", "timeout", "on_error", "prefix", "pool_size")
    )
    if redis is None:
        return StoreSpec()
    topologies = [k for k in ("url", "cluster", "sentinel") if k in redis]
    if len(topologies) != 1:
        r.error(rpath, "set exactly one of url, cluster or sentinel")
    url = r.field(redis, "url", rpath, as_str, None)
    if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
        r.error(rpath + ("url",), f"unsupported Redis URL {url!r}: use redis://, rediss:// or unix://")
    cluster: tuple[str, ...] = ()
    if "cluster" in redis:
        seeds = r.sequence(redis["cluster"], rpath + ("cluster",), allow_scalar=True)
        for i, seed in enumerate(seeds):
            if not isinstance(seed, str) or not seed.startswith(("redis://", "rediss://")):
                r.error(rpath + ("cluster", i), f"expected a redis:// seed URL, got {seed!r}")
        cluster = tuple(str(s) for s in seeds)
        if not seeds:
            r.error(rpath + ("cluster",), "a cluster needs at least one seed node")
    sentinel = _sentinel(r, redis["sentinel"], rpath + ("sentinel",)) if "sentinel" in redis else None
    timeout = r.field(redis, "timeout", rpath, positive_duration_ms, 50) or 50
    return StoreSpec(
        redis=RedisSpec(
            url=url,
            cluster=cluster,
            sentinel=sentinel,
            timeout_ms=timeout,
            on_error=r.field(redis, "on_error", rpath, one_of("local", "allow", "deny"), "local") or "local",  # type: ignore[arg-type]
            prefix=_prefix(r, redis, rpath),
            pool_size=r.field(redis, "pool_size", rpath, int_in(1, 10_000, "pool_size"), 64) or 64,
        )
    )


def _prefix(r: Reader, data: dict[str, Any], path: KeyPath) -> str:
    value = data.get("prefix", "")
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        r.error(path + ("prefix",), "expected a string")
        return ""
    return value


def _sentinel(r: Reader, value: Any, path: KeyPath) -> SentinelSpec | None:
    data = r.mapping(
        value, path, ("master", "nodes", "password", "sentinel_password", "db"), required=("master", "nodes")
    )
    if data is None or "master" not in data or "nodes" not in data:
        return None
    parse = host_port(default_port=26379)
    nodes: list[tuple[str, int]] = []
    for i, item in enumerate(r.sequence(data["nodes"], path + ("nodes",), allow_scalar=True)):
        try:
            nodes.append(parse(item))
        except ValueError as exc:
            r.error(path + ("nodes", i), str(exc))
    return SentinelSpec(
        master=r.field(data, "master", path, as_str) or "",
        nodes=tuple(nodes),
        password=r.field(data, "password", path, as_str, None),
        sentinel_password=r.field(data, "sentinel_password", path, as_str, None),
        db=r.field(data, "db", path, int_in(0, 10_000, "db"), 0) or 0,
    )
