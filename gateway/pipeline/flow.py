"""The per-request flow, in order:

    real client address -> server rules -> route match -> access.deny, bans -> route rules
    -> limits -> allow/deny (nginx's access phase) -> proxy -> log

As in nginx, the guard rules and ``return`` (the rewrite phases) answer before the limits
(``limit_req``/``limit_conn``: the preaccess phase), and those before ``allow``/``deny``
(the access phase): a denied client is counted by the limits first.

Each step reads the immutable plan of the current configuration (snapshotted
once per request, so a reload never mixes two configurations in one request).
Logging happens when aiohttp finishes the response (``accesslog``), or here
with status 499 when the client goes away first.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion11
from multidict import CIMultiDict

from gateway.bans.local import Ban, BanList
from gateway.clock import epoch_ms
from gateway.edge import unsupported_version
from gateway.http import responses
from gateway.http.addheader import add_headers
from gateway.http.context import RequestContext
from gateway.http.realip import UNKNOWN, parse_addr
from gateway.http.returns import CLOSE, ReturnPlan, answer_return
from gateway.http.routing import BadURI, normalize_uri
from gateway.http.rules import first_answer
from gateway.http.validate import request_problem
from gateway.logs import error as errorlog
from gateway.logs.access import CTX_KEY, AccessLog
from gateway.metrics.stats import BANNED, STATS
from gateway.pipeline.limiting import Admission, Limiter
from gateway.plan.compiled import CompiledConfig, RoutePlan
from gateway.proxy.forward import forward_http
from gateway.proxy.headers import is_websocket_upgrade
from gateway.proxy.upstream import UpstreamPool, Upstreams
from gateway.proxy.websocket import forward_websocket


class Pipeline:
    def __init__(
        self, config: CompiledConfig, upstreams: Upstreams, access_log: AccessLog, limiter: Limiter, bans: BanList
    ) -> None:
        self.config = config
        self.upstreams = upstreams
        self.access_log = access_log
        self.limiter = limiter
        self.bans = bans

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        config = self.config  # one snapshot per request
        pools = self.upstreams.pools  # (and of the pools that go with it: a reload swaps both)
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        peer = parse_addr(request.remote or "") or UNKNOWN
        protocol = request.protocol
        tls = getattr(protocol, "tls", None)  # set once per connection by the edge
        port = sockname[1] if sockname else 0
        ctx = RequestContext(request, time.monotonic(), peer, "http" if tls is None else "https", port, tls)
        ctx.proxy = getattr(protocol, "proxy", None)  # ... and so is the PROXY protocol header
        request[CTX_KEY] = ctx
        try:
            response = await self._handle(request, ctx, config, pools, sockname)
            route = ctx.route
            if route is not None and route.add_header and not response.prepared:  # the gateway's own answer
                add_headers(response.headers, route.add_header, response.status, ctx)
            return response
        except asyncio.CancelledError:
            if not ctx.logged:  # the client closed the connection first: nginx's 499
                ctx.logged = True
                ctx.status = 499
                self.access_log.write(ctx, request, None, time.monotonic() - ctx.started)
            raise
        except ConnectionError:
            # The client went away while we wrote to it (a reset, or aiohttp's "Connection
            # lost" for a write that was waiting to drain). aiohttp's attempt to finish this
            # placeholder fails quietly and logs the request, with our 499.
            ctx.status = 499
            return web.Response(status=499)

    async def _handle(
        self,
        request: web.BaseRequest,
        ctx: RequestContext,
        config: CompiledConfig,
        pools: dict[str, UpstreamPool],
        sockname: Any,
    ) -> web.StreamResponse:
        accept = request.headers.get("Accept", "")
        refused = unsupported_version(request) or (400 if ctx.method == "CONNECT" else 0)
        if refused:  # HTTP/0.9, HTTP/2.0 and up; CONNECT: never an open proxy
            response = responses.error(refused, accept)
            response.force_close()
            return response
        refused, reason = request_problem(
            ctx.request_target, ctx.authority, request.headers, ctx.version == HttpVersion11
        )
        if refused:  # a fragment in the target, a host nginx refuses, a transfer coding other than chunked
            errorlog.request_event("info", ctx, reason)
            response = responses.error(refused, accept, reason)
            response.force_close()
            return response
        # 1. real client address
        if config.realip.trusted:
            realip = config.realip
            if realip.proxy_protocol:
                ctx.client = realip.resolve_proxy(ctx.peer, ctx.proxy)
            else:
                ctx.client = realip.resolve(ctx.peer, request.headers)
        # 2. virtual server, then route
        server = config.single
        if server is None:
            server = config.vhosts.find((sockname[0], sockname[1]) if sockname else None, ctx.host)
        ctx.server = server
        try:
            ctx.uri = normalize_uri(ctx.path_only)
        except BadURI as exc:
            return responses.error(400, accept, str(exc))
        if server.rules:  # nginx's server rewrite phase: before a location is chosen
            ret = first_answer(server.rules, ctx)
            if ret is not None:
                return self._answer(request, ctx, ret, accept)
        match = server.table.match(ctx.uri)
        if match.refused:  # a backend would read the URI as one routed elsewhere (routing.backend_readings)
            return responses.error(400, accept, match.refused)
        if match.redirect is not None:
            query = f"?{ctx.raw_query}" if ctx.raw_query else ""
            return responses.redirect(match.redirect + query)
        route = match.route
        if route is None:
            return responses.error(404, accept, "no route for this URI")
        ctx.route = route
        # 3. the global access lists: deny is always 403; allow is never limited nor banned; then bans
        if config.deny and ctx.client in config.deny:
            return self._forbidden(ctx, accept)
        exempt = bool(config.allow) and ctx.client in config.allow
        if self.bans.bans and not exempt:
            ban = self.bans.match(ctx.client, epoch_ms())
            if ban is not None:
                return self._banned(ctx, ban, accept)
        if route.answers:  # rules, then return: answered here, before limits (nginx's rewrite phase)
            ret = first_answer(route.rules, ctx) if route.rules else None
            if ret is None:
                ret = route.ret
            if ret is not None:
                return self._answer(request, ctx, ret, accept)
        pool = pools[route.upstream]  # before any limit is taken: nothing to give back if it fails
        # 4. limits: limit_req and limit_count, the delay, then limit_conn
        admission = None
        if route.has_limits and not exempt:
            admission = await self.limiter.admit(route, ctx)
            if admission.response is None and admission.delay_s:
                await asyncio.sleep(admission.delay_s)
            if admission.response is None and route.limit_conn:
                await self.limiter.take_conn(admission, ctx)
            if admission.response is not None:
                return admission.response
        # 5. allow/deny: nginx's first-match list in force for the route (its access phase)
        if route.access is not None and not route.access.allows(ctx.client):
            if admission is not None:
                self.limiter.finish(admission)
            return self._forbidden(ctx, accept)
        # 6. proxy (and 7. the log line, written when the response is done)
        pool.in_flight += 1
        if admission is not None and admission.conn is not None and admission.conn.taken:
            # Its slots go back before the response's last bytes do, not after: a client that
            # sends its next request at once (maybe to another worker or node) finds them free.
            ctx.on_last_write = functools.partial(self.limiter.finish, admission)
        try:
            return await self._forward(request, ctx, config, route, admission, pool)
        finally:
            pool.in_flight -= 1
            if admission is not None:
                self.limiter.finish(admission)

    def _answer(self, request: web.BaseRequest, ctx: RequestContext, ret: ReturnPlan, accept: str) -> web.Response:
        if ret.code != CLOSE:
            return answer_return(ret, ctx, accept)
        # 444: nginx closes the connection and sends nothing (NGX_HTTP_CLOSE); the log says 444.
        # The line is written first, then the transport aborted: aiohttp's attempt to send the
        # placeholder fails quietly, and its log call finds the request logged already.
        ctx.status = CLOSE
        ctx.body_bytes_sent = 0
        ctx.logged = True
        self.access_log.write(ctx, request, None, time.monotonic() - ctx.started)
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=CLOSE)

    @staticmethod
    def _forbidden(ctx: RequestContext, accept: str) -> web.Response:
        errorlog.request_event("error", ctx, "access forbidden by rule")  # nginx's words, at its level
        return responses.error(403, accept, "access forbidden")

    def _banned(self, ctx: RequestContext, ban: Ban, accept: str) -> web.Response:
        STATS.decision("", "ban", BANNED)  # a manual ban (or blocklist): no zone
        errorlog.request_event("info", ctx, f'access forbidden by ban on {ban.target} ("{ban.reason}")')
        headers: CIMultiDict[str] = CIMultiDict()
        if ban.until_ms:
            headers["Retry-After"] = str(max(1, -(-(ban.until_ms - epoch_ms()) // 1000)))
        return responses.error(self.config.spec.bans.status, accept, "client banned", headers=headers)

    def _forward(
        self,
        request: web.BaseRequest,
        ctx: RequestContext,
        config: CompiledConfig,
        route: RoutePlan,
        admission: Admission | None,
        pool: UpstreamPool,
    ) -> Awaitable[web.StreamResponse]:
        """The proxying coroutine, for ``_handle`` to await: not a coroutine level of its own,
        which every resume of the request would go through."""
        trusted_peer = bool(config.realip.trusted) and ctx.peer in config.realip.trusted
        extra = self.limiter.headers(admission) if admission is not None else ()
        if is_websocket_upgrade(request.headers):
            return self._websocket(request, ctx, route, pool, extra, trusted_peer)
        return forward_http(
            request,
            ctx,
            pool,
            request.headers,
            route.client_max_body_size,
            extra,
            trusted_peer=trusted_peer,
            body_timeout=route.client_body_timeout_s,
            buffers=route.buffers,
            rewrite=route.rewrite,
        )

    async def _websocket(
        self,
        request: web.BaseRequest,
        ctx: RequestContext,
        route: RoutePlan,
        pool: UpstreamPool,
        extra: Sequence[tuple[str, str]],
        trusted_peer: bool,
    ) -> web.StreamResponse:
        try:
            return await forward_websocket(
                request, ctx, pool, extra, trusted_peer=trusted_peer, buffers=route.buffers, rewrite=route.rewrite
            )
        except asyncio.CancelledError:
            if ctx.status == 101 and not ctx.logged:
                # The client closed its tunnel (or shutdown ended it): the 101 went out, and
                # that is what the log says (nginx too), not 499.
                ctx.logged = True
                self.access_log.write(ctx, request, None, time.monotonic() - ctx.started)
            raise
