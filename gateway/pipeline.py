"""The per-request flow, in order:

    real client address -> route match -> access rules -> limits -> proxy -> log

Each step reads the immutable plan of the current configuration (snapshotted
once per request, so a reload never mixes two configurations in one request).
Logging happens when aiohttp finishes the response (``accesslog``), or here
with status 499 when the client goes away first.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from gateway import responses
from gateway.accesslog import CTX_KEY, AccessLog
from gateway.context import RequestContext
from gateway.plan import CompiledConfig
from gateway.proxy.forward import forward_http
from gateway.proxy.headers import is_websocket_upgrade, upstream_request_headers
from gateway.proxy.upstream import Upstreams
from gateway.proxy.websocket import forward_websocket
from gateway.realip import UNKNOWN, parse_addr
from gateway.routing import BadURI, normalize_uri


class Pipeline:
    def __init__(self, config: CompiledConfig, upstreams: Upstreams, access_log: AccessLog) -> None:
        self.config = config
        self.upstreams = upstreams
        self.access_log = access_log

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        config = self.config  # one snapshot per request
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        peer = parse_addr(request.remote or "") or UNKNOWN
        ctx = RequestContext(request, time.monotonic(), peer, "http", sockname[1] if sockname else 0)
        request[CTX_KEY] = ctx
        try:
            return await self._handle(request, ctx, config)
        except asyncio.CancelledError:
            if not ctx.logged:  # the client closed the connection first: nginx's 499
                ctx.logged = True
                ctx.status = 499
                self.access_log.write(ctx, request, None, time.monotonic() - ctx.started)
            raise

    async def _handle(
        self, request: web.BaseRequest, ctx: RequestContext, config: CompiledConfig
    ) -> web.StreamResponse:
        accept = request.headers.get("Accept", "")
        # 1. real client address
        if config.realip.trusted:
            ctx.client = config.realip.resolve(ctx.peer, request.headers)
        # 2. route
        try:
            ctx.uri = normalize_uri(ctx.path_only)
        except BadURI as exc:
            return responses.error(400, accept, str(exc))
        match = config.table.match(ctx.uri)
        if match.redirect is not None:
            query = f"?{ctx.raw_query}" if ctx.raw_query else ""
            return responses.redirect(match.redirect + query)
        route = match.route
        if route is None:
            return responses.error(404, accept, "no route for this URI")
        ctx.route = route
        # 3. access rules and 4. limits come from the limits and cluster issues.
        # 5. proxy
        pool = self.upstreams.pools[route.upstream]
        websocket = is_websocket_upgrade(request.headers)
        headers = upstream_request_headers(
            request.headers,
            peer_ip=ctx.peer.text,
            client_ip=ctx.client.text,
            trusted_peer=bool(config.realip.trusted) and ctx.peer in config.realip.trusted,
            scheme=ctx.scheme,
            host_override=pool.spec.host,
            websocket=websocket,
        )
        if websocket:
            return await forward_websocket(request, ctx, pool, headers)
        return await forward_http(request, ctx, pool, headers, route.client_max_body_size)
