"""The limits step of the pipeline: ask the store, then speak nginx to the operator.

* Status variables: ``$limit_req_status`` (PASSED, DELAYED, REJECTED,
  DELAYED_DRY_RUN, REJECTED_DRY_RUN), ``$limit_conn_status`` (PASSED, REJECTED,
  REJECTED_DRY_RUN) and ``$limit_count_status`` (PASSED, REJECTED,
  REJECTED_DRY_RUN); empty when no limit of that kind applied.
* Error log lines as nginx writes them: ``limiting requests, excess: 2.000 by
  zone "per_ip"``, ``delaying request, excess: 1.000, by zone "per_ip"``,
  ``limiting connections by zone "conns"`` (with ``, dry run`` in dry run).
* Rejections: the configured status, ``Retry-After`` in whole seconds (rounded
  up), the RateLimit headers, and a short text or JSON body.
* Every response of a limited route carries ``RateLimit-Policy`` and ``RateLimit``
  (draft-ietf-httpapi-ratelimit-headers) unless ``ratelimit_headers: false``.

RateLimit header mapping (documented in the README):
  limit_req   policy ``"zone";q=N;w=1`` for ``Nr/s`` (``w=60`` for ``r/m``); ``r`` = requests
              that would pass right now ((burst - excess) // 1000), ``t`` = seconds until
              the bucket is empty;
  limit_count policy ``"zone";q=limit;w=window``; ``r`` = limit - used; ``t`` = seconds to the
              end of the window;
  limit_conn  policy ``"zone";q=max;qu="concurrent-requests"``; ``r`` = max - in flight.
  gcra        policy ``"zone";q=burst+1;w=seconds to fill burst+1``; ``r`` = CL.THROTTLE's
              remaining, ``t`` = its reset_after; ``Retry-After`` = its retry_after.
  token       policy ``"zone";q=N;w=period`` for ``N r/period``; ``r`` = whole permits stored,
              ``t`` = seconds until the bucket is full; ``Retry-After`` = until a request
              would wait no more than ``max_delay``.
  sliding_log policy ``"zone";q=limit;w=window``; ``r`` = limit - logged requests, ``t`` =
              seconds until the newest slides out; ``Retry-After`` = until the oldest does.

Status variables of the newer algorithms: ``$limit_gcra_status``, ``$limit_sliding_log_status``,
``$limit_token_status`` (PASSED, DELAYED, REJECTED and their _DRY_RUN forms).
A token zone's wait is applied like a limit_req delay (the longest of them wins).
The zones of the newer algorithms (``limits:`` entries of type gcra, sliding_log) reject with
``limit_count_status`` (429 by default); a ``cost`` variable that is present but not a
whole number is a 400.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from gateway.errors import StoreUnavailable
from gateway.http import responses
from gateway.http.context import RequestContext
from gateway.limits import nginx_req
from gateway.limits.conn import ConnDecision
from gateway.logs import error as errorlog
from gateway.metrics import stats as m
from gateway.metrics.activity import Activity
from gateway.plan.compiled import AlgoLimit, ReqLimit, RoutePlan
from gateway.store.base import Store, Verdict

PASSED = "PASSED"
DELAYED = "DELAYED"
REJECTED = "REJECTED"
DELAYED_DRY_RUN = "DELAYED_DRY_RUN"
REJECTED_DRY_RUN = "REJECTED_DRY_RUN"

_LOWER = {"error": "warn", "warn": "notice", "notice": "info", "info": "info"}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


MAX_COST = 1_000_000_000


def _cost(limit: AlgoLimit, ctx: RequestContext) -> int:
    """The request's cost in a zone: the variable's value (1 when absent), -1 when it is not a number."""
    if limit.cost_key is None:
        return limit.cost
    raw = limit.cost_key(ctx)
    if not raw:
        return 1
    if not raw.isdigit() or len(raw) > 10 or int(raw) > MAX_COST:
        return -1
    return int(raw)


def _milli(value: int) -> str:
    return f"{value // 1000}.{value % 1000:03d}"


@dataclass(slots=True)
class Admission:
    """What the limits decided for one request, carried until the request ends."""

    route: RoutePlan
    verdict: Verdict | None = None
    delay_s: float = 0.0
    response: web.StreamResponse | None = None
    conn: ConnDecision | None = None
    conn_keys: list[bytes] = field(default_factory=list)
    items: list[str] = field(default_factory=list)  # RateLimit field items
    bypassed: bool = False  # the store was unavailable and on_error let the request through
    conn_zones: tuple[str, ...] = ()  # the limit_conn zones whose slots this request holds (metrics)
    delayed_by: str = ""  # the zone whose delay the request waits out (its limit_req zone first)


class Limiter:
    def __init__(self, store: Store, activity: Activity | None = None) -> None:
        self.store = store
        self.activity = activity  # the status page's counts (gateway/metrics/activity.py)
        # What to do when the shared store cannot answer: "allow" or "deny". (A Redis
        # store with on_error: local falls back to its embedded store by itself.)
        self.on_error = store.on_error
        self._last_outage_log = 0.0
        self.stats = m.STATS

    async def admit(self, route: RoutePlan, ctx: RequestContext) -> Admission:
        """Evaluate limit_req and limit_count (and limit_conn when there is no delay)."""
        # A comprehension is a function call on Python 3.11, even over nothing: a route's
        # unused kinds get a plain empty list.
        req_keys = [limit.key(ctx) for limit in route.limit_req] if route.limit_req else []
        count_keys = [limit.key(ctx) for limit in route.limit_count] if route.limit_count else []
        conn_keys = [limit.key(ctx) for limit in route.limit_conn] if route.limit_conn else []
        algo: list[tuple[bytes, int]] = []
        if route.limit_algo:
            algo = [(limit.key(ctx), _cost(limit, ctx)) for limit in route.limit_algo]
            if any(cost < 0 for _, cost in algo):
                admission = Admission(route=route)
                admission.response = responses.error(400, ctx.headers.get("Accept", ""), "invalid request cost")
                return admission
        try:
            verdict = await self.store.admit(route, req_keys, count_keys, conn_keys, algo)
        except StoreUnavailable as exc:
            return self._store_down(route, ctx, exc)
        admission = Admission(route=route, verdict=verdict, conn_keys=conn_keys)
        dry = route.dry_run
        retry_after = 0
        status = 0
        rejected_by: tuple[str, bytes] | None = None  # the zone that refused it, and its key there
        req = verdict.req
        # A count rejection (outside dry run) drops this request's limit_req accounting:
        # it is then neither delayed nor reported as passed.
        count_stops = bool(route.limit_count) and verdict.count_rejected >= 0 and not dry
        if req is not None and req.rc != nginx_req.DECLINED:
            if req.rc >= nginx_req.BUSY:
                limit = route.limit_req[req.index]
                ctx.limit_req_status = REJECTED_DRY_RUN if dry else REJECTED
                outcome = m.BANNED if req.rc == nginx_req.FORBIDDEN else m.REJECTED_DRY_RUN if dry else m.REJECTED
                limit.counts[outcome] += 1
                retry_after = self._req_rejection(ctx, route, limit, req, verdict.now_ms)
                if route.ratelimit_headers:
                    admission.items.append(f'"{limit.zone}";r=0;t={retry_after}')
                if not dry:
                    status = route.limit_req_status
                    rejected_by = (limit.zone, req_keys[req.index])
            elif not count_stops:
                self._req_items(admission, route, req)
                if req.delay_ms:
                    limit = route.limit_req[req.index]
                    level = _LOWER[route.limit_req_log_level]
                    errorlog.request_event(
                        level,
                        ctx,
                        f"delaying request{', dry run' if dry else ''}, excess: {_milli(req.excess)}, "
                        f'by zone "{limit.zone}"',
                    )
                    ctx.limit_req_status = DELAYED_DRY_RUN if dry else DELAYED
                    self._passed(route.limit_req, req.excesses, req.index)
                    limit.counts[m.DELAYED_DRY_RUN if dry else m.DELAYED] += 1
                    if not dry:
                        admission.delay_s = req.delay_ms / 1000
                        admission.delayed_by = limit.zone
                        self.stats.delay(limit.zone, admission.delay_s)
                else:
                    ctx.limit_req_status = PASSED
                    self._passed(route.limit_req, req.excesses, -1)
        if route.limit_count and not status:
            rejected = verdict.count_rejected
            if rejected >= 0:
                count_limit = route.limit_count[rejected]
                ctx.limit_count_status = REJECTED_DRY_RUN if dry else REJECTED
                count_limit.counts[m.REJECTED_DRY_RUN if dry else m.REJECTED] += 1
                reset_ms = verdict.count_reset_ms[rejected] or 0
                errorlog.request_event(
                    route.limit_req_log_level,
                    ctx,
                    f"limiting requests{', dry run' if dry else ''}, count: {count_limit.limit}/{count_limit.limit} "
                    f'in {count_limit.window_ms // 1000}s by zone "{count_limit.zone}"',
                )
                retry_after = max(retry_after, _ceil_div(reset_ms, 1000))
                if not dry:
                    status = route.limit_count_status
                    rejected_by = (count_limit.zone, count_keys[rejected])
            elif any(used is not None for used in verdict.count_used):
                ctx.limit_count_status = PASSED
                self._passed(route.limit_count, verdict.count_used, -1)
            self._count_items(admission, route, verdict)
        if route.limit_algo and not status:
            status, retry_after = self._algo_outcome(ctx, admission, verdict, retry_after)
            if status:
                rejected_by = (route.limit_algo[verdict.algo_rejected].zone, algo[verdict.algo_rejected][0])
        if verdict.conn is not None:
            admission.conn = verdict.conn
            if not status:
                status, retry_after = self._conn_outcome(ctx, admission, verdict.conn, retry_after)
                if status:
                    rejected_by = (route.limit_conn[verdict.conn.rejected].zone, conn_keys[verdict.conn.rejected])
        if status:
            admission.response = self._reject(route, status, retry_after, ctx.headers.get("Accept", ""), admission)
        if self.activity is not None:
            self.activity.decided(
                route, rejected_by, admission.delayed_by, req_keys, count_keys, conn_keys, algo, ctx.client
            )
        return admission

    async def take_conn(self, admission: Admission, ctx: RequestContext) -> None:
        """limit_conn for a request that waited out a limit_req delay."""
        route = admission.route
        if not route.limit_conn or admission.conn is not None or admission.bypassed:
            return
        try:
            decision = await self.store.acquire_conn(route, admission.conn_keys)
        except StoreUnavailable as exc:
            down = self._store_down(route, ctx, exc)
            admission.response = down.response
            admission.bypassed = True
            return
        admission.conn = decision
        status, retry_after = self._conn_outcome(ctx, admission, decision, 0)
        if status and self.activity is not None:  # after a delay: counted delayed, now also rejected
            self.activity.reject(
                route.limit_conn[decision.rejected].zone, admission.conn_keys[decision.rejected], ctx.client
            )
        if status:
            admission.response = self._reject(route, status, retry_after, ctx.headers.get("Accept", ""), admission)

    def finish(self, admission: Admission) -> None:
        if admission.conn is not None and admission.conn.taken:
            self.store.release(admission.route, admission.conn)
        if admission.conn_zones:
            self.stats.conn_taken(admission.conn_zones, -1)
            admission.conn_zones = ()

    @staticmethod
    def _passed(limits: Sequence[Any], applied: Sequence[Any], skip: int) -> None:
        """Every zone that counted the request (and did not decide otherwise) passed it."""
        n = len(applied)
        for i, limit in enumerate(limits):
            if i < n and applied[i] is not None and i != skip:
                limit.counts[m.PASSED] += 1

    def headers(self, admission: Admission) -> list[tuple[str, str]]:
        route = admission.route
        if not route.ratelimit_headers or not route.ratelimit_policy:
            return []
        out = [("RateLimit-Policy", route.ratelimit_policy)]
        if admission.items:
            out.append(("RateLimit", ", ".join(admission.items)))
        return out

    def _store_down(self, route: RoutePlan, ctx: RequestContext, exc: StoreUnavailable) -> Admission:
        """The store did not answer in time: apply ``on_error`` (logged at most once a second)."""
        now = time.monotonic()
        if now - self._last_outage_log >= 1.0:
            self._last_outage_log = now
            verb = "rejecting requests with 503" if self.on_error == "deny" else "letting requests through"
            errorlog.log.error("limit store unavailable (%s): on_error=%s, %s", exc, self.on_error, verb)
        admission = Admission(route=route, bypassed=True)
        if self.on_error == "deny":
            headers: CIMultiDict[str] = CIMultiDict({"Retry-After": "1"})
            accept = ctx.headers.get("Accept", "")
            admission.response = responses.error(503, accept, "rate limit state unavailable", headers=headers)
        return admission

    # -- helpers ---------------------------------------------------------------------------------
    def _req_rejection(
        self, ctx: RequestContext, route: RoutePlan, limit: ReqLimit, req: nginx_req.ReqDecision, now_ms: int
    ) -> int:
        dry = ", dry run" if route.dry_run else ""
        if req.rc == nginx_req.BUSY:
            ban = f", banned for {limit.ban_s}s" if req.new_ban else ""
            errorlog.request_event(
                route.limit_req_log_level,
                ctx,
                f'limiting requests{dry}, excess: {_milli(req.excess)} by zone "{limit.zone}"{ban}',
            )
            if req.new_ban:
                return limit.ban_s
            wait_ms = _ceil_div((req.excess - limit.burst_m) * 1000, limit.rate_m)
            return max(1, _ceil_div(wait_ms, 1000))
        if req.rc == nginx_req.FORBIDDEN:
            errorlog.request_event("info", ctx, f'rejecting banned key{dry} by zone "{limit.zone}"')
            return max(1, _ceil_div(req.ban_until - now_ms, 1000))
        errorlog.request_event("alert", ctx, f'could not allocate node in limit_req zone "{limit.zone}"')
        return 1

    def _req_items(self, admission: Admission, route: RoutePlan, req: nginx_req.ReqDecision) -> None:
        if not route.ratelimit_headers:
            return
        items = admission.items
        for limit, excess in zip(route.limit_req, req.excesses, strict=True):
            if excess is None:
                continue
            if not excess:
                items.append(limit.idle_item)
                continue
            remaining = max(0, (limit.burst_m - excess) // 1000)
            items.append(f'"{limit.zone}";r={remaining};t={_ceil_div(excess, limit.rate_m)}')

    def _count_items(self, admission: Admission, route: RoutePlan, verdict: Verdict) -> None:
        if not route.ratelimit_headers:
            return
        for i, limit in enumerate(route.limit_count):
            used = verdict.count_used[i] if i < len(verdict.count_used) else None
            if used is None:
                continue
            reset = verdict.count_reset_ms[i] or 0
            remaining = max(0, limit.limit - used)
            admission.items.append(f'"{limit.zone}";r={remaining};t={_ceil_div(reset, 1000)}')

    def _algo_outcome(
        self, ctx: RequestContext, admission: Admission, verdict: Verdict, retry_after: int
    ) -> tuple[int, int]:
        route = admission.route
        dry = route.dry_run
        status = 0
        rejected = verdict.algo_rejected
        if rejected >= 0 and rejected < len(verdict.algo):
            limit = route.limit_algo[rejected]
            outcome = verdict.algo[rejected]
            assert outcome is not None
            statuses = ctx.algo_status
            if statuses is None:
                statuses = ctx.algo_status = {}
            statuses[limit.type] = REJECTED_DRY_RUN if dry else REJECTED
            limit.counts[m.REJECTED_DRY_RUN if dry else m.REJECTED] += 1
            errorlog.request_event(
                route.limit_req_log_level,
                ctx,
                f"limiting requests{', dry run' if dry else ''}, {limit.type}: remaining {outcome.remaining} "
                f'of {outcome.limit}, retry after {outcome.retry_after_s}s by zone "{limit.zone}"',
            )
            if outcome.retry_after_s > 0:
                retry_after = max(retry_after, outcome.retry_after_s)
            if not dry:
                status = route.limit_count_status
        for limit, maybe in zip(route.limit_algo, verdict.algo, strict=False):
            if maybe is None or not maybe.allowed:
                continue
            statuses = ctx.algo_status
            if statuses is None:
                statuses = ctx.algo_status = {}
            if maybe.delay_ms and status == 0 and rejected < 0:
                errorlog.request_event(
                    _LOWER[route.limit_req_log_level],
                    ctx,
                    f"delaying request{', dry run' if dry else ''}, {limit.type}: {maybe.delay_ms} ms, "
                    f'by zone "{limit.zone}"',
                )
                statuses[limit.type] = DELAYED_DRY_RUN if dry else DELAYED
                limit.counts[m.DELAYED_DRY_RUN if dry else m.DELAYED] += 1
                if not dry:
                    admission.delay_s = max(admission.delay_s, maybe.delay_ms / 1000)
                    admission.delayed_by = admission.delayed_by or limit.zone
                    self.stats.delay(limit.zone, maybe.delay_ms / 1000)
            else:
                limit.counts[m.PASSED] += 1
                if limit.type not in statuses:
                    statuses[limit.type] = PASSED
        if route.ratelimit_headers:
            for limit, maybe in zip(route.limit_algo, verdict.algo, strict=False):
                if maybe is not None:
                    admission.items.append(f'"{limit.zone}";r={max(0, maybe.remaining)};t={maybe.reset_s}')
        return status, retry_after

    def _conn_outcome(
        self, ctx: RequestContext, admission: Admission, decision: ConnDecision, retry_after: int
    ) -> tuple[int, int]:
        route = admission.route
        dry = route.dry_run
        if decision.rejected >= 0:
            limit = route.limit_conn[decision.rejected]
            ctx.limit_conn_status = REJECTED_DRY_RUN if dry else REJECTED
            limit.counts[m.REJECTED_DRY_RUN if dry else m.REJECTED] += 1
            if decision.zone_full:
                errorlog.request_event("alert", ctx, f'limit_conn zone "{limit.zone}" is full')
            else:
                errorlog.request_event(
                    route.limit_conn_log_level,
                    ctx,
                    f'limiting connections{", dry run," if dry else ""} by zone "{limit.zone}"',
                )
            if not dry:
                return route.limit_conn_status, max(retry_after, 1)
            return 0, retry_after
        # Every zone that counted the request passed it; its RateLimit item says what is left.
        zones: list[str] = []
        items = admission.items if route.ratelimit_headers else None
        for limit, count in zip(route.limit_conn, decision.counts, strict=True):
            if count is None:
                continue
            limit.counts[m.PASSED] += 1
            zones.append(limit.zone)
            if items is not None:
                items.append(f'"{limit.zone}";r={max(0, limit.max - count)}')
        if zones:
            ctx.limit_conn_status = PASSED
            if decision.taken:
                admission.conn_zones = tuple(zones)
                self.stats.conn_taken(zones, 1)
        return 0, retry_after

    def _reject(
        self, route: RoutePlan, status: int, retry_after: int, accept: str, admission: Admission
    ) -> web.Response:
        headers: CIMultiDict[str] = CIMultiDict()
        if retry_after > 0:
            headers["Retry-After"] = str(retry_after)
        for name, value in self.headers(admission):
            headers[name] = value
        extra: dict[str, object] | None = {"retry_after": retry_after} if retry_after > 0 else None
        return responses.error(status, accept, "rate limit exceeded", headers=headers, extra=extra)
