"""Each logged request through the route table and the embedded store, on the log's clock.

The decisions are the gateway's own: ``LocationTable`` picks the route, the access
rules apply (deny = 403, allow = exempt; a route's allow/deny list after its limits, as
nginx's access phase), and ``MemoryStore.decide`` runs the pure limit modules
(``gateway/limits``) with zone sizes bounding memory, with a clock
that reads the log's timestamps. The statuses follow ``gateway/pipeline/limiting.py``.

The client address is the logged ``$remote_addr`` (already the real client behind
trusted proxies). A delayed request takes its limit_conn slot when its delay ends,
as the gateway does; its outcome is yielded then, so outcomes come out in order of
arrival but may wait for the delays before them. A slot is held until the request's
logged end (start + ``$request_time``; at once without it).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from multidict import CIMultiDict, CIMultiDictProxy

from gateway.http.context import RequestContext, host_of
from gateway.http.realip import UNKNOWN, parse_addr
from gateway.http.routing import BadURI, normalize_uri
from gateway.http.rules import first_answer
from gateway.limits import nginx_req
from gateway.limits.conn import ConnDecision
from gateway.plan.compiled import CompiledConfig, RoutePlan
from gateway.replay.logread import LogRequest
from gateway.store.memory import MemoryStore

PASSED, DELAYED, REJECTED = "PASSED", "DELAYED", "REJECTED"


@dataclass(slots=True)
class ZoneOutcome:
    zone: str
    result: str  # PASSED, DELAYED or REJECTED (dry run included: what would have happened)
    key: bytes
    delay_ms: int = 0


@dataclass(slots=True)
class Outcome:
    t_ms: int
    route: str  # the location, or "(no route)", "(redirect)", "(bad uri)" (refused), "(rule)" (a server rule answered)
    limit_req_status: str = ""
    limit_conn_status: str = ""
    limit_count_status: str = ""
    status: int = 0  # the gateway's answer when it would reject (0: proxied)
    delay_ms: int = 0
    denied: bool = False
    zones: list[ZoneOutcome] = field(default_factory=list)
    logged: dict[str, str] = field(default_factory=dict)
    pending: bool = False  # waiting for its delay to end before limit_conn
    late_ms: int = 0  # replayed this much after its start (out of order beyond the reorder window)


class Simulator:
    def __init__(self, config: CompiledConfig) -> None:
        self.config = config
        self.now = 0
        self.store = MemoryStore(clock_ms=lambda: self.now)
        self.store.configure(config.spec.zones)
        self._held: list[tuple[int, int, RoutePlan, ConnDecision]] = []
        self._deferred: list[tuple[int, int, RoutePlan, list[bytes], Outcome, LogRequest]] = []
        self._seq = 0
        self._names: dict[int, str] = {}  # route -> its location as text (the plan's routes live as long as this)

    def run(self, requests: Iterator[LogRequest]) -> Iterator[Outcome]:
        waiting: deque[Outcome] = deque()
        for req in requests:
            self.advance(req.t_ms)
            waiting.append(self.one(req))
            while waiting and not waiting[0].pending:
                yield waiting.popleft()
        self.advance(None)
        yield from waiting

    def advance(self, until: int | None) -> None:
        """Slots released and delayed requests' slots taken, in time order, up to ``until`` (None: all)."""
        while True:
            held = self._held[0][0] if self._held else None
            deferred = self._deferred[0][0] if self._deferred else None
            due = [t for t in (held, deferred) if t is not None and (until is None or t <= until)]
            if not due:
                return
            if held is not None and held == min(due):
                _, _, route, decision = heapq.heappop(self._held)
                self.store.release(route, decision)
                continue
            at, _, route, keys, out, req = heapq.heappop(self._deferred)
            self.now = at
            out.pending = False
            self.conn_outcome(route, self.store.take_conn(route, keys), keys, out, req)

    def one(self, req: LogRequest) -> Outcome:
        self.now = req.t_ms
        ctx = context_of(req.fields)
        out = Outcome(t_ms=req.t_ms, route="", logged=req.fields, late_ms=req.late_ms)
        try:
            ctx.uri = normalize_uri(ctx.path_only)
        except BadURI:
            out.route = "(bad uri)"
            return out
        server = self.config.single or self.config.vhosts.find(None, ctx.host)  # by $host (the log has no address)
        if server.rules and first_answer(server.rules, ctx) is not None:
            out.route = "(rule)"  # the server's rules answered: no route, no limit
            return out
        match = server.table.match(ctx.uri)
        if match.route is None:
            out.route = "(bad uri)" if match.refused else "(redirect)" if match.redirect else "(no route)"
            return out
        route = match.route
        name = self._names.get(id(route))
        if name is None:
            name = self._names[id(route)] = str(route.location)
        out.route = name
        if self.config.deny and ctx.client in self.config.deny:
            out.denied, out.status = True, 403
            return out
        if route.rules and first_answer(route.rules, ctx) is not None:
            return out  # a rule answers before the limits: nothing taken from a zone
        exempt = bool(self.config.allow) and ctx.client in self.config.allow
        if route.has_limits and not exempt:
            self.decide(route, ctx, req, out)
        if route.access is not None and not out.status and not out.pending and not route.access.allows(ctx.client):
            out.denied, out.status = True, 403  # the allow/deny list, after the limits (nginx's access phase)
        return out

    def decide(self, route: RoutePlan, ctx: RequestContext, req: LogRequest, out: Outcome) -> None:
        dry = route.dry_run
        req_keys = [limit.key(ctx) for limit in route.limit_req]
        count_keys = [limit.key(ctx) for limit in route.limit_count]
        conn_keys = [limit.key(ctx) for limit in route.limit_conn]
        verdict = self.store.decide(route, req_keys, count_keys, conn_keys)
        suffix = "_DRY_RUN" if dry else ""
        d = verdict.req
        count_stops = bool(route.limit_count) and verdict.count_rejected >= 0 and not dry
        if d is not None and d.rc != nginx_req.DECLINED:
            for i, limit in enumerate(route.limit_req):
                if i == d.index and d.rc >= nginx_req.BUSY:
                    out.zones.append(ZoneOutcome(limit.zone, REJECTED, req_keys[i]))
                elif d.excesses[i] is not None and not (d.rc >= nginx_req.BUSY and i > d.index):
                    wait = nginx_req.delay_of(d.excesses[i] or 0, limit) if d.rc == nginx_req.OK else 0
                    out.zones.append(ZoneOutcome(limit.zone, DELAYED if wait else PASSED, req_keys[i], wait))
            if d.rc >= nginx_req.BUSY:
                out.limit_req_status = REJECTED + suffix
                out.status = 0 if dry else route.limit_req_status
            elif not count_stops:
                out.limit_req_status = (DELAYED + suffix) if d.delay_ms else PASSED
                out.delay_ms = 0 if dry else d.delay_ms
        if route.limit_count and not out.status:
            for i, count_limit in enumerate(route.limit_count):
                if i < len(verdict.count_used) and verdict.count_used[i] is not None:
                    result = REJECTED if i == verdict.count_rejected else PASSED
                    out.zones.append(ZoneOutcome(count_limit.zone, result, count_keys[i]))
            if verdict.count_rejected >= 0:
                out.limit_count_status = REJECTED + suffix
                out.status = 0 if dry else route.limit_count_status
            elif any(used is not None for used in verdict.count_used):
                out.limit_count_status = PASSED
        conn = verdict.conn
        if conn is None and route.limit_conn and not out.status and d is not None and d.delay_ms and not dry:
            self._seq += 1  # the gateway takes the slot after the delay
            out.pending = True
            heapq.heappush(self._deferred, (req.t_ms + d.delay_ms, self._seq, route, conn_keys, out, req))
        if conn is not None and not out.status:
            self.conn_outcome(route, conn, conn_keys, out, req)

    def conn_outcome(
        self, route: RoutePlan, conn: ConnDecision, keys: list[bytes], out: Outcome, req: LogRequest
    ) -> None:
        suffix = "_DRY_RUN" if route.dry_run else ""
        for i, limit in enumerate(route.limit_conn):
            if conn.counts[i] is not None:
                result = REJECTED if i == conn.rejected else PASSED
                out.zones.append(ZoneOutcome(limit.zone, result, keys[i]))
        if conn.rejected >= 0:
            out.limit_conn_status = REJECTED + suffix
            out.status = 0 if route.dry_run else route.limit_conn_status
        elif conn.applied:
            out.limit_conn_status = PASSED
        if conn.taken:
            self._seq += 1
            heapq.heappush(self._held, (max(req.end_ms, self.now), self._seq, route, conn))


def context_of(fields: dict[str, str]) -> RequestContext:
    """A request context from logged fields, with what key extractors read."""
    ctx = RequestContext.__new__(RequestContext)
    method, target = _request_parts(fields)
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in fields.items():
        if value:
            header = _HEADERS.get(name)
            if header is None:
                header = _header_of(name)
            if header:
                headers.add(header, value)
    host = fields.get("host") or headers.get("Host") or ""
    ctx.method = method
    ctx.raw_target = target
    query_at = target.find("?")
    ctx.raw_query = target[query_at + 1 :] if query_at >= 0 else ""
    ctx.headers = CIMultiDictProxy(headers)
    ctx.host = host_of(host)
    ctx.client = parse_addr(fields.get("remote_addr", "")) or UNKNOWN
    ctx.peer = ctx.client
    ctx.scheme = fields.get("scheme") or "http"
    port = fields.get("server_port", "")
    ctx.server_port = int(port) if port.isdigit() else 80
    ctx.uri = ""
    ctx.variables = None  # maps and geo used more than once keep their values here
    return ctx


_HEADERS: dict[str, str] = {}  # logged field -> request header ("" for the others)


def _header_of(name: str) -> str:
    header = name[5:].replace("_", "-") if name.startswith("http_") else ""
    if len(_HEADERS) < 4096:  # a json log's keys are the log's to choose: bounded
        _HEADERS[name] = header
    return header


def _request_parts(fields: dict[str, str]) -> tuple[str, str]:
    request = fields.get("request", "")
    if request:
        parts = request.split(" ")
        method = parts[0]
        target = parts[1] if len(parts) > 1 else "/"
    else:
        method = fields.get("request_method", "GET")
        target = fields.get("request_uri", "")
        if not target:
            uri, args = fields.get("uri", "/"), fields.get("args", "")
            target = uri + ("?" + args if args else "")
    if not target.startswith("/"):
        split = urlsplit(target)
        target = (split.path or "/") + ("?" + split.query if split.query else "")
    return method, target
