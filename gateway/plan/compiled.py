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

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.bans.table import CidrSet, net_key
from gateway.config.limits import LimitReqSpec, LimitUseSpec
from gateway.config.routes import ReturnSpec, RouteSettings, RouteSpec, RuleSpec
from gateway.config.schema import ConfigSpec
from gateway.config.zones import ZoneSpec
from gateway.edge.tls import SniTable, sni_tables
from gateway.http.access import AccessRule, AccessRules
from gateway.http.addheader import AddedHeader
from gateway.http.keys import KeyFn, KeyTemplate, compile_key
from gateway.http.maps import Variables
from gateway.http.realip import Network, RealIp
from gateway.http.returns import ReturnPlan
from gateway.http.routing import Location, LocationTable
from gateway.http.rules import RulePlan, compile_condition
from gateway.http.templates import ValueFn, ValueTemplate, compile_value
from gateway.http.vhosts import ServerTable
from gateway.limits.params import AlgoParams, ConnParams, CountParams, ReqParams
from gateway.limits.registry import algo_type, algo_types
from gateway.metrics.stats import STATS, new_slots
from gateway.proxy.headers import SetFields
from gateway.proxy.rewrite import UpstreamRewrite
from gateway.proxy.spool import BufferPolicy

if TYPE_CHECKING:
    from gateway.http.context import RequestContext

# nginx's "nodelay": the delay threshold is never reached.
NODELAY_M = (2**63 - 1) // 1000 * 1000
DEFAULT_BODY_LIMIT = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ReqLimit(ReqParams):
    """A ``limit_req`` entry of a route: its parameters (``ReqParams``), and for the request path
    its key and what its headers and metrics say."""

    key: KeyFn
    rate_text: str  # as written: "10r/s"
    ban_s: int
    window_s: int  # 1 for r/s, 60 for r/m (for RateLimit-Policy)
    rate_count: int  # N of "Nr/s"
    counts: list[int] = field(default_factory=new_slots, compare=False, repr=False)  # decisions (metrics)
    # its RateLimit field item for a key with no excess (the common case): the whole burst left
    idle_item: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "idle_item", f'"{self.zone}";r={self.burst_m // 1000};t=0')


@dataclass(frozen=True, slots=True, kw_only=True)
class CountLimit(CountParams):
    key: KeyFn
    counts: list[int] = field(default_factory=new_slots, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnLimit(ConnParams):
    key: KeyFn
    counts: list[int] = field(default_factory=new_slots, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class AlgoLimit(AlgoParams):
    """A zone of the newer algorithms (``gateway.limits.registry``), from a route's ``limits:`` list."""

    key: KeyFn
    cost: int  # units per request when cost_key is None
    cost_key: KeyFn | None  # the cost from a variable (a request without a valid one gets a 400)
    counts: list[int] = field(default_factory=new_slots, compare=False, repr=False)

    @property
    def policy_item(self) -> str:
        return self.algo.policy(self.zone, self.params)


@dataclass(frozen=True, slots=True)
class SetHeaders:
    """A route's ``proxy_set_header``: the names it replaces, and the values to send."""

    names: frozenset[str]  # lower case, with those removed by an empty value
    values: tuple[tuple[str, ValueFn], ...]

    def fields(self, ctx: RequestContext) -> SetFields:
        out = []
        for name, fn in self.values:
            value = fn(ctx)
            if value:  # a variable that is empty removes the header, as in nginx
                out.append((name, value))
        return self.names, out


# Framing, hop-by-hop and handshake headers are the gateway's own: proxy_set_header leaves them alone.
PROXY_SET_IGNORED = frozenset(
    {"connection", "upgrade", "content-length", "transfer-encoding", "te", "keep-alive", "expect", "trailer",
     "proxy-connection", "proxy-authenticate", "proxy-authorization"}
)  # fmt: skip


def _set_headers(items: tuple[tuple[str, ValueTemplate], ...] | None, variables: Variables | None) -> SetHeaders | None:
    if not items:
        return None
    kept = [(name, value) for name, value in items if name.lower() not in PROXY_SET_IGNORED]
    # Host cannot be removed (HTTP/1.1 needs one): an empty Host keeps the default.
    kept = [(name, value) for name, value in kept if not (name.lower() == "host" and not value.source)]
    if not kept:
        return None
    return SetHeaders(
        names=frozenset(name.lower() for name, _ in kept),
        values=tuple((name, compile_value(value, variables=variables)) for name, value in kept if value.source),
    )


def _rewrite(
    route: RouteSpec, set_header: tuple[tuple[str, ValueTemplate], ...] | None, variables: Variables | None
) -> UpstreamRewrite | None:
    headers = _set_headers(set_header, variables)
    if route.uri is None and headers is None:
        return None
    cut = len(route.location.value) if route.uri is not None else 0
    return UpstreamRewrite(route.uri, cut, headers.fields if headers is not None else None)


def _return(spec: ReturnSpec | None, variables: Variables | None) -> ReturnPlan | None:
    if spec is None:
        return None
    return ReturnPlan(
        code=spec.code,
        url=compile_value(spec.url, variables=variables) if spec.url is not None else None,
        text=compile_value(spec.text, body=True, variables=variables) if spec.text is not None else None,
    )


def _rules(specs: tuple[RuleSpec, ...], variables: Variables | None) -> tuple[RulePlan, ...]:
    out = []
    for spec in specs:
        ret = _return(spec.ret, variables)
        assert ret is not None
        out.append(RulePlan(str(spec.condition), compile_condition(spec.condition, variables), ret))
    return tuple(out)


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
    limit_algo: tuple[AlgoLimit, ...]
    limit_req_status: int
    limit_conn_status: int
    limit_count_status: int
    limit_req_log_level: str
    limit_conn_log_level: str
    dry_run: bool
    ratelimit_headers: bool
    ratelimit_policy: str  # the RateLimit-Policy field, fixed per route
    rewrite: UpstreamRewrite | None = None  # uri and proxy_set_header (None: neither)
    add_header: tuple[AddedHeader, ...] = ()
    ret: ReturnPlan | None = None
    rules: tuple[RulePlan, ...] = ()  # guards: the first that holds answers (before ret)
    answers: bool = False  # rules or ret: the request path's one test for both
    access: AccessRules | None = None  # the allow/deny list in force (its own, the server's or the top's)
    label: str = ""  # the route label of the metrics (its location, as written)

    @property
    def has_limits(self) -> bool:
        return bool(self.limit_req or self.limit_count or self.limit_conn or self.limit_algo)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerPlan:
    """One virtual server: its ``$server_name`` and its locations."""

    name: str
    routes: tuple[RoutePlan, ...]
    table: LocationTable[RoutePlan]
    rules: tuple[RulePlan, ...] = ()  # run before a route is chosen (nginx's server rewrite phase)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompiledConfig:
    spec: ConfigSpec
    routes: tuple[RoutePlan, ...]  # of every server
    table: LocationTable[RoutePlan]  # the first server's
    servers: tuple[ServerPlan, ...]
    single: ServerPlan | None  # the only server: no choice to make per request
    vhosts: ServerTable[ServerPlan]
    realip: RealIp
    allow: CidrSet  # access.allow and allow_file: one set probe per prefix length, like the bans
    deny: CidrSet
    tls: Mapping[tuple[str, int], SniTable]  # each TLS address's certificates, by SNI name


def _pick(route: RouteSettings, defaults: RouteSettings, name: str, fallback: object) -> object:
    value = getattr(route, name)
    if value is None:
        value = getattr(defaults, name)
    return fallback if value is None else value


def compile_config(spec: ConfigSpec) -> CompiledConfig:
    zones = spec.zones
    # maps and geo: compiled once here, each on first use (a config without them pays nothing)
    variables = Variables(spec.maps, spec.geo, variable_uses(spec)) if spec.maps or spec.geo else None
    key_fns: dict[str, KeyFn] = {
        name: compile_key(zone.key, max_key=zone.max_key, ipv6_prefix=zone.ipv6_prefix, variables=variables)
        for name, zone in zones.items()
    }
    servers: list[ServerPlan] = []
    access = _AccessLists()
    for server in spec.servers:
        outer = server.access if server.access is not None else spec.access.rules
        plans = tuple(
            _route_plan(route, spec, key_fns, variables, access.of(route.access if route.access is not None else outer))
            for route in server.routes
        )
        table = LocationTable([(plan.location, plan) for plan in plans])
        servers.append(ServerPlan(name=server.name, routes=plans, table=table, rules=_rules(server.rules, variables)))
    vhosts = ServerTable([(s.names, s.listen, s.default, plan) for s, plan in zip(spec.servers, servers, strict=True)])
    return CompiledConfig(
        spec=spec,
        routes=tuple(plan for server in servers for plan in server.routes),
        table=servers[0].table,
        servers=tuple(servers),
        single=servers[0] if len(servers) == 1 else None,
        vhosts=vhosts,
        realip=RealIp(spec.real_ip.trusted, spec.real_ip.header, spec.real_ip.recursive),
        allow=_cidr_set(spec.access.allow, spec.access.allow_from_file),
        deny=_cidr_set(spec.access.deny, spec.access.deny_from_file),
        tls=sni_tables(spec),
    )


class _AccessLists:
    """nginx's allow/deny lists compiled once each: the routes that inherit one list share it."""

    def __init__(self) -> None:
        self.compiled: dict[tuple[AccessRule, ...], AccessRules] = {}

    def of(self, rules: tuple[AccessRule, ...] | None) -> AccessRules | None:
        if not rules:  # none in force, or an empty list of its own: every client goes on
            return None
        found = self.compiled.get(rules)
        if found is None:
            found = self.compiled[rules] = AccessRules(rules)
        return found


def _route_plan(
    route: RouteSpec,
    spec: ConfigSpec,
    key_fns: dict[str, KeyFn],
    variables: Variables | None,
    access: AccessRules | None = None,
) -> RoutePlan:
    zones = spec.zones
    s, d = route.settings, spec.defaults
    req_specs = s.limit_req if s.limit_req is not None else (d.limit_req or ())
    count_specs = s.limit_count if s.limit_count is not None else (d.limit_count or ())
    conn_specs = s.limit_conn if s.limit_conn is not None else (d.limit_conn or ())
    uses = s.limits if s.limits is not None else (d.limits or ())
    # the generic limits: list adds to each kind, after that kind's own list
    all_req: list[LimitReqSpec | LimitUseSpec] = [*req_specs, *(u for u in uses if u.type == "req")]
    all_count = [c.zone for c in count_specs] + [u.zone for u in uses if u.type == "count"]
    all_conn = [(c.zone, c.max) for c in conn_specs] + [(u.zone, u.max) for u in uses if u.type == "conn"]
    req_limits = tuple(_req(zones[r.zone], key_fns[r.zone], r.burst, r.delay, r.nodelay) for r in all_req)
    count_limits = tuple(
        CountLimit(
            zone=z,
            key=key_fns[z],
            limit=zones[z].limit,
            window_ms=zones[z].window_ms,
            sliding=zones[z].window_type == "sliding",
            counts=STATS.slots(z, "limit_count"),
        )
        for z in all_count
    )
    conn_limits = tuple(
        ConnLimit(zone=z, key=key_fns[z], max=m, counts=STATS.slots(z, "limit_conn")) for z, m in all_conn
    )
    algo_limits = tuple(_algo(zones[u.zone], key_fns[u.zone], u, variables) for u in uses if u.type in algo_types())
    return RoutePlan(
        index=route.index,
        location=route.location,
        upstream=str(_pick(s, d, "upstream", "")),
        client_max_body_size=int(_pick(s, d, "client_max_body_size", DEFAULT_BODY_LIMIT)),  # type: ignore[call-overload]
        client_body_timeout_s=int(_pick(s, d, "client_body_timeout_ms", 60_000)) / 1000,  # type: ignore[call-overload]
        buffers=_buffers(s, d, spec.temp_path),
        limit_req=req_limits,
        limit_count=count_limits,
        limit_conn=conn_limits,
        limit_algo=algo_limits,
        limit_req_status=int(_pick(s, d, "limit_req_status", 503)),  # type: ignore[call-overload]
        limit_conn_status=int(_pick(s, d, "limit_conn_status", 503)),  # type: ignore[call-overload]
        limit_count_status=int(_pick(s, d, "limit_count_status", 429)),  # type: ignore[call-overload]
        limit_req_log_level=str(_pick(s, d, "limit_req_log_level", "error")),
        limit_conn_log_level=str(_pick(s, d, "limit_conn_log_level", "error")),
        dry_run=bool(_pick(s, d, "dry_run", False)),
        ratelimit_headers=bool(_pick(s, d, "ratelimit_headers", True)),
        ratelimit_policy=_policy(req_limits, count_limits, conn_limits, algo_limits),
        rewrite=_rewrite(
            route, s.proxy_set_header if s.proxy_set_header is not None else d.proxy_set_header, variables
        ),
        add_header=tuple(
            AddedHeader(a.name, compile_value(a.value, variables=variables), a.always)
            for a in (s.add_header if s.add_header is not None else (d.add_header or ()))
        ),
        ret=_return(route.ret, variables),
        rules=_rules(route.rules, variables),
        answers=bool(route.rules) or route.ret is not None,
        access=access,
        label=str(route.location),
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


def _policy(
    req: tuple[ReqLimit, ...], count: tuple[CountLimit, ...], conn: tuple[ConnLimit, ...], algo: tuple[AlgoLimit, ...]
) -> str:
    """The RateLimit-Policy field (draft-ietf-httpapi-ratelimit-headers): one item per limit."""
    items = [f'"{r.zone}";q={r.rate_count};w={r.window_s}' for r in req]
    items += [f'"{c.zone}";q={c.limit};w={-(-c.window_ms // 1000)}' for c in count]
    items += [f'"{c.zone}";q={c.max};qu="concurrent-requests"' for c in conn]
    items += [a.policy_item for a in algo]
    return ", ".join(items)


def _algo(zone: ZoneSpec, key: KeyFn, use: LimitUseSpec, variables: Variables | None) -> AlgoLimit:
    cost_var = use.cost_var if use.cost is None and use.cost_var is not None else None
    if use.cost is None and use.cost_var is None:
        cost_var = zone.cost_var
    return AlgoLimit(
        zone=zone.name,
        type=zone.type,
        key=key,
        params=algo_type(zone.type).params_of(zone),
        cost=use.cost if use.cost is not None else zone.cost,
        cost_key=compile_key(cost_var, max_key=64, variables=variables) if cost_var is not None else None,
        counts=STATS.slots(zone.name, "limit_" + zone.type),
    )


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
        counts=STATS.slots(zone.name, "limit_req"),
    )


def variable_uses(spec: ConfigSpec) -> Counter[str]:
    """How many templates of the configuration name each variable: a map or geo named more than
    once may be needed more than once per request, and keeps its value in the request context."""
    templates: list[KeyTemplate | ValueTemplate] = []
    for zone in spec.zones.values():
        templates.append(zone.key)
        if zone.cost_var is not None:
            templates.append(zone.cost_var)
    settings = [spec.defaults] + [route.settings for server in spec.servers for route in server.routes]
    for s in settings:
        templates += [value for _, value in s.proxy_set_header or ()]
        templates += [a.value for a in s.add_header or ()]
        templates += [u.cost_var for u in s.limits or () if u.cost_var is not None]
    rules = [rule for server in spec.servers for rule in server.rules]
    rules += [rule for server in spec.servers for route in server.routes for rule in route.rules]
    returns = [rule.ret for rule in rules]
    returns += [route.ret for server in spec.servers for route in server.routes if route.ret is not None]
    for ret in returns:
        templates += [t for t in (ret.url, ret.text) if t is not None]
    for rule in rules:
        templates += [t for t in (rule.condition.variable, rule.condition.value) if t is not None]
    for m in spec.maps.values():
        templates += [m.source, m.default, *(entry.value for entry in m.entries)]
    for g in spec.geo.values():
        if g.source is not None:
            templates.append(g.source)
    return Counter(_names(templates))


def _names(templates: Iterable[KeyTemplate | ValueTemplate]) -> Iterable[str]:
    for template in templates:
        for kind, name in template.parts:
            if kind == "var":
                yield name
