"""WebSocket pass-through: the upstream handshake first, then frames both ways.

The upstream connection is opened before the client's upgrade is accepted, so a
refusal upstream (403, 404, ...) reaches the client as that status, and the
subprotocol the upstream picked is the one the client gets. Compression is off
on both legs so frames pass as they are; pings, pongs and close codes are
relayed, not answered by the gateway.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import WSMsgType, web

from gateway import errorlog, responses
from gateway.context import RequestContext
from gateway.proxy.upstream import UpstreamPool

MAX_MESSAGE = 16 * 1024 * 1024


async def forward_websocket(
    request: web.BaseRequest,
    ctx: RequestContext,
    pool: UpstreamPool,
    headers: dict[str, str] | aiohttp.typedefs.LooseHeaders,
) -> web.StreamResponse:
    accept = request.headers.get("Accept", "")
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    tried: set[int] = set()
    started = time.monotonic()
    timed_out = False
    for _attempt in range(pool.max_tries):
        peer = pool.balancer.pick(tried)
        if peer is None:
            break
        tried.add(peer.index)
        ctx.upstream_addr = peer.address
        try:
            upstream = await pool.session.ws_connect(
                pool.ws_url(peer, ctx.raw_target),
                headers=headers,
                protocols=offered,
                autoclose=False,
                autoping=False,
                max_msg_size=MAX_MESSAGE,
                compress=0,
                ssl=pool.ssl,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0),
            )
        except aiohttp.WSServerHandshakeError as exc:
            pool.balancer.report(peer, failed=False)
            ctx.upstream_status = str(exc.status)
            status = exc.status if 400 <= exc.status <= 599 else 502
            return responses.error(status, accept, "upstream refused the WebSocket upgrade")
        except (TimeoutError, aiohttp.ClientError) as exc:
            timed_out = isinstance(exc, (aiohttp.ServerTimeoutError, asyncio.TimeoutError))
            errorlog.request_event("error", ctx, f"WebSocket connect to upstream failed ({exc!s})")
            pool.balancer.report(peer, failed=True)
            continue
        pool.balancer.report(peer, failed=False)
        ctx.upstream_status = "101"
        try:
            return await _bridge(request, upstream)
        finally:
            await upstream.close()
            ctx.upstream_time = f"{time.monotonic() - started:.3f}"
    return responses.error(504 if timed_out else 502, accept)


async def _bridge(request: web.BaseRequest, upstream: aiohttp.ClientWebSocketResponse) -> web.WebSocketResponse:
    protocols = (upstream.protocol,) if upstream.protocol else ()
    client = web.WebSocketResponse(
        protocols=protocols, autoclose=False, autoping=False, max_msg_size=MAX_MESSAGE, compress=False
    )
    await client.prepare(request)
    to_upstream = asyncio.ensure_future(_pump(client, upstream))
    to_client = asyncio.ensure_future(_pump(upstream, client))
    try:
        await asyncio.wait((to_upstream, to_client), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (to_upstream, to_client):
            task.cancel()
        await asyncio.gather(to_upstream, to_client, return_exceptions=True)
        if not client.closed:
            await client.close()
    return client


async def _pump(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
) -> None:
    while True:
        msg = await source.receive()
        kind = msg.type
        if kind is WSMsgType.TEXT:
            await sink.send_str(msg.data)
        elif kind is WSMsgType.BINARY:
            await sink.send_bytes(msg.data)
        elif kind is WSMsgType.PING:
            await sink.ping(msg.data)
        elif kind is WSMsgType.PONG:
            await sink.pong(msg.data)
        elif kind is WSMsgType.CLOSE:
            await sink.close(code=msg.data or 1000, message=(msg.extra or "").encode())
            return
        else:  # CLOSING, CLOSED, ERROR
            if not sink.closed:
                await sink.close(code=1011 if kind is WSMsgType.ERROR else 1000)
            return
