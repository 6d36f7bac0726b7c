"""Specs compiled into what the request path reads: one immutable plan per route.

Everything fallible or costly happens here, once per load: location regexes,
key extractors, rates in milli-requests, inheritance from ``defaults``, status
codes. A reload builds a whole new ``CompiledConfig`` and swaps one reference.

Inheritance (documented in the README): a route's setting wins; otherwise the
value in ``defaults``; otherwise the built-in default. A ``limit_*`` list is
inherited whole, and only when the route has no list of that kind at all, as
nginx inherits ``limit_req`` from the enclosing level. ``limit_req: []`` on a
route switches inherited limits off.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.banlist import CidrSet, net_key
from gateway.config.schema import ConfigSpec, RouteSettings, ZoneSpec
from gateway.keys import KeyFn, compile_key
from gateway.proxy.spool import BufferPolicy
from gateway.realip import Network, RealIp
from gateway.routing import Location, LocationTable

# nginx's "nodelay": the delay threshold is never reached.
NODELAY_M = (2**63 - 1) // 1000 * 1000
DEFAULT_BODY_LIMIT = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ReqLimit:
    zone: str
    key: KeyFn
    rate_m: int  # milli-requests per second, nginx-truncated
    rate_text: str  # as written: "10r/s"
    burst_m: int
    delay_m: int  # NODELAY_M for nodelay
    ban_s: int
    ban_ms: int
    window_s: int  # 1 for r/s, 60 for r/m (for RateLimit-Policy)
    rate_count: int  # N of "Nr/s"


@dataclass(frozen=True, slots=True, kw_only=True)
class CountLimit:
    zone: str
    key: KeyFn
    limit: int
    window_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnLimit:
    zone: str
    key: KeyFn
    max: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutePlan:
    index: int
    location: Location
    upstream: str
    client_max_body_size: int
    client_body_timeout_s: float  # nginx's client_body_timeout: between two reads of the body
    buffers: BufferPolicy  # proxy_request_buffering, proxy_buffering and their sizes, temp_path
    limit_req: tuple[ReqLimit, ...]
    limit_count: tuple[CountLimit, ...]
    limit_conn: tuple[ConnLimit, ...]
    limit_req_status: int
    limit_conn_status: int
    limit_count_status: int
    limit_req_log_level: str
    limit_conn_log_level: str
    dry_run: bool
    ratelimit_headers: bool
    ratelimit_policy: str  # the RateLimit-Policy field, fixed per route

    @property
    def has_limits(self) -> bool:
        return bool(self.limit_req or self.limit_count or self.limit_conn)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompiledConfig:
    spec: ConfigSpec
    routes: tuple[RoutePlan, ...]
    table: LocationTable[RoutePlan]
    realip: RealIp
    allow: CidrSet  # access.allow and allow_file: one set probe per prefix length, like the bans
    deny: CidrSet


def _pick(route: RouteSettings, defaults: RouteSettings, name: str, fallback: object) -> object:
    value = getattr(route, name)
    if value is None:
        value = getattr(defaults, name)
    return fallback if value is None else value


def compile_config(spec: ConfigSpec) -> CompiledConfig:
    zones = spec.zones
    key_fns: dict[str, KeyFn] = {
        name: compile_key(zone.key, max_key=zone.max_key, ipv6_prefix=zone.ipv6_prefix) for name, zone in zones.items()
    }
    routes: list[RoutePlan] = []
    for route in spec.routes:
        s, d = route.settings, spec.defaults
        req_specs = s.limit_req if s.limit_req is not None else (d.limit_req or ())
        count_specs = s.limit_count if s.limit_count is not None else (d.limit_count or ())
        conn_specs = s.limit_conn if s.limit_conn is not None else (d.limit_conn or ())
        req_limits = tuple(_req(zones[r.zone], key_fns[r.zone], r.burst, r.delay, r.nodelay) for r in req_specs)
        count_limits = tuple(
            CountLimit(zone=c.zone, key=key_fns[c.zone], limit=zones[c.zone].limit, window_ms=zones[c.zone].window_ms)
            for c in count_specs
        )
        conn_limits = tuple(ConnLimit(zone=c.zone, key=key_fns[c.zone], max=c.max) for c in conn_specs)
        routes.append(
            RoutePlan(
                index=route.index,
                location=route.location,
                upstream=str(_pick(s, d, "upstream", "")),
                client_max_body_size=int(_pick(s, d, "client_max_body_size", DEFAULT_BODY_LIMIT)),  # type: ignore[call-overload]
                client_body_timeout_s=int(_pick(s, d, "client_body_timeout_ms", 60_000)) / 1000,  # type: ignore[call-overload]
                buffers=_buffers(s, d, spec.temp_path),
                limit_req=tuple(_req(zones[r.zone], key_fns[r.zone], r.burst, r.delay, r.nodelay) for r in req_specs),
                limit_count=tuple(
                    CountLimit(
                        zone=c.zone, key=key_fns[c.zone], limit=zones[c.zone].limit, window_ms=zones[c.zone].window_ms
                    )
                    for c in count_specs
                ),
                limit_conn=tuple(ConnLimit(zone=c.zone, key=key_fns[c.zone], max=c.max) for c in conn_specs),
                limit_req_status=int(_pick(s, d, "limit_req_status", 503)),  # type: ignore[call-overload]
                limit_conn_status=int(_pick(s, d, "limit_conn_status", 503)),  # type: ignore[call-overload]
                limit_count_status=int(_pick(s, d, "limit_count_status", 429)),  # type: ignore[call-overload]
                limit_req_log_level=str(_pick(s, d, "limit_req_log_level", "error")),
                limit_conn_log_level=str(_pick(s, d, "limit_conn_log_level", "error")),
                dry_run=bool(_pick(s, d, "dry_run", False)),
                ratelimit_headers=bool(_pick(s, d, "ratelimit_headers", True)),
                ratelimit_policy=_policy(req_limits, count_limits, conn_limits),
            )
        )
    return CompiledConfig(
        spec=spec,
        routes=tuple(routes),
        table=LocationTable([(plan.location, plan) for plan in routes]),
        realip=RealIp(spec.real_ip.trusted, spec.real_ip.header, spec.real_ip.recursive),
        allow=_cidr_set(spec.access.allow, spec.access.allow_from_file),
        deny=_cidr_set(spec.access.deny, spec.access.deny_from_file),
    )


def _buffers(s: RouteSettings, d: RouteSettings, temp_path: str | None) -> BufferPolicy:
    defaults = BufferPolicy()
    return BufferPolicy(
        request_buffering=bool(_pick(s, d, "proxy_request_buffering", defaults.request_buffering)),
        client_body_buffer_size=int(_pick(s, d, "client_body_buffer_size", defaults.client_body_buffer_size)),  # type: ignore[call-overload]
        client_body_deadline_s=int(_pick(s, d, "client_body_deadline_ms", 300_000)) / 1000,  # type: ignore[call-overload]
        response_buffering=bool(_pick(s, d, "proxy_buffering", defaults.response_buffering)),
        proxy_buffers=int(_pick(s, d, "proxy_buffers", defaults.proxy_buffers)),  # type: ignore[call-overload]
        max_temp_file_size=int(_pick(s, d, "proxy_max_temp_file_size", defaults.max_temp_file_size)),  # type: ignore[call-overload]
        temp_path=temp_path,
    )


def _cidr_set(inline: tuple[Network, ...], from_file: tuple[str, ...]) -> CidrSet:
    keys = [(n.version, n.prefixlen, int(n.network_address)) for n in inline]
    return CidrSet(keys + [net_key(target) for target in from_file])


def _policy(req: tuple[ReqLimit, ...], count: tuple[CountLimit, ...], conn: tuple[ConnLimit, ...]) -> str:
    """The RateLimit-Policy field (draft-ietf-httpapi-ratelimit-headers): one item per limit."""
    items = [f'"{r.zone}";q={r.rate_count};w={r.window_s}' for r in req]
    items += [f'"{c.zone}";q={c.limit};w={-(-c.window_ms // 1000)}' for c in count]
    items += [f'"{c.zone}";q={c.max};qu="concurrent-requests"' for c in conn]
    return ", ".join(items)


def _req(zone: ZoneSpec, key: KeyFn, burst: int, delay: int, nodelay: bool) -> ReqLimit:
    assert zone.rate is not None
    return ReqLimit(
        zone=zone.name,
        key=key,
        rate_m=zone.rate.rate_m,
        rate_text=str(zone.rate),
        burst_m=burst * 1000,
        delay_m=NODELAY_M if nodelay else delay * 1000,
        ban_s=zone.ban_s,
        ban_ms=zone.ban_s * 1000,
        window_s=zone.rate.scale,
        rate_count=zone.rate.count,
    )
