"""Forwarding one HTTP request to an upstream, like nginx's ``proxy_pass``.

* Bodies stream both ways; neither is held in memory (small responses with a
  known length are read whole, which is faster and bounded).
* ``proxy_next_upstream error timeout``: a connect failure or connect timeout moves
  on to the next server for any method (nothing was sent). An error or timeout
  after the request went out is retried only for idempotent requests whose body
  was not read yet. Failures feed the balancer's ``max_fails``.
* Outcomes: refused/down -> 502 at once; timeout -> 504; body over
  ``client_max_body_size`` -> 413.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp import web

from gateway import errorlog, responses
from gateway.context import RequestContext
from gateway.proxy.balancer import Peer
from gateway.proxy.headers import client_response_headers
from gateway.proxy.upstream import UpstreamPool

BUFFER_LIMIT = 256 * 1024
NON_IDEMPOTENT = frozenset({"POST", "LOCK", "PATCH"})
_NO_BODY_STATUS = frozenset({204, 304})


class BodyTooLarge(Exception):
    pass


class RequestBody:
    """The client's body as an async iterator that counts bytes and knows if it was touched."""

    def __init__(self, request: web.BaseRequest, limit: int) -> None:
        self.request = request
        self.limit = limit
        self.started = False
        self.received = 0

    async def _chunks(self) -> AsyncIterator[bytes]:
        self.started = True
        if self.request.headers.get("Expect", "").lower() == "100-continue":
            version = self.request.version
            await self.request.writer.write(f"HTTP/{version.major}.{version.minor} 100 Continue\r\n\r\n".encode())
        limit = self.limit
        async for chunk in self.request.content.iter_any():
            self.received += len(chunk)
            if limit and self.received > limit:
                raise BodyTooLarge()
            yield chunk

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()


def _cause(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None and isinstance(exc, aiohttp.ClientError):
        exc = exc.__cause__
    return exc


async def forward_http(
    request: web.BaseRequest,
    ctx: RequestContext,
    pool: UpstreamPool,
    headers: aiohttp.typedefs.LooseHeaders,
    max_body: int,
    extra_headers: Sequence[tuple[str, str]] = (),
) -> web.StreamResponse:
    accept = request.headers.get("Accept", "")
    length = request.content_length
    if max_body and length is not None and length > max_body:
        errorlog.request_event("error", ctx, f"client intended to send too large body: {length} bytes")
        return responses.error(413, accept, "request body too large")
    body = RequestBody(request, max_body) if request.body_exists else None
    method = ctx.method
    tried: set[int] = set()
    addrs: list[str] = []
    statuses: list[str] = []
    timed_out = False
    started = time.monotonic()
    balancer = pool.balancer
    for _attempt in range(pool.max_tries):
        peer = balancer.pick(tried)
        if peer is None:
            break
        tried.add(peer.index)
        addrs.append(peer.address)
        try:
            upstream = await pool.session.request(
                method,
                pool.url(peer, ctx.raw_target),
                headers=headers,
                data=body,
                allow_redirects=False,
                ssl=pool.ssl,
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            # Nothing reached the upstream: any method may go to the next server.
            timed_out = isinstance(exc, aiohttp.ConnectionTimeoutError)
            statuses.append("504" if timed_out else "502")
            _report_failure(
                ctx,
                pool,
                peer,
                "upstream timed out while connecting to upstream"
                if timed_out
                else f"connect() failed ({_cause(exc)!s}) while connecting to upstream",
            )
            continue
        except (TimeoutError, aiohttp.ClientError) as exc:
            cause = _cause(exc)
            if isinstance(cause, BodyTooLarge):
                ctx.upstream_addr = ", ".join(addrs)
                errorlog.request_event(
                    "error", ctx, f"client intended to send too large body: more than {max_body} bytes"
                )
                _close_client(request)
                return responses.error(413, accept, "request body too large")
            if (
                body is not None
                and body.started
                and isinstance(cause, (aiohttp.ClientPayloadError, ConnectionResetError))
                and request.content.exception() is not None
            ):
                ctx.upstream_addr = ", ".join(addrs)
                errorlog.request_event("info", ctx, "client prematurely closed connection while sending request body")
                return responses.error(400, accept, "client closed the request body early")
            timed_out = isinstance(exc, (aiohttp.ServerTimeoutError, asyncio.TimeoutError))
            statuses.append("504" if timed_out else "502")
            _report_failure(
                ctx,
                pool,
                peer,
                "upstream timed out while reading response header from upstream"
                if timed_out
                else f"upstream prematurely closed connection ({cause!s})",
            )
            if method in NON_IDEMPOTENT or (body is not None and body.started):
                break
            continue
        balancer.report(peer, failed=False)
        statuses.append(str(upstream.status))
        ctx.upstream_addr = ", ".join(addrs)
        ctx.upstream_status = ", ".join(statuses)
        try:
            return await _relay(request, ctx, upstream, extra_headers)
        finally:
            upstream.release()
            ctx.upstream_time = f"{time.monotonic() - started:.3f}"
    ctx.upstream_addr = ", ".join(addrs)
    ctx.upstream_status = ", ".join(statuses)
    ctx.upstream_time = f"{time.monotonic() - started:.3f}" if addrs else ""
    if not addrs:
        errorlog.request_event("error", ctx, f'no live upstreams while connecting to upstream "{pool.name}"')
    status = 504 if timed_out else 502
    return responses.error(status, accept)


def _report_failure(ctx: RequestContext, pool: UpstreamPool, peer: Peer, message: str) -> None:
    ctx.upstream_addr = peer.address
    errorlog.request_event("error", ctx, message)
    if pool.balancer.report(peer, failed=True):
        errorlog.log.warning('upstream server temporarily disabled: %s in upstream "%s"', peer.address, pool.name)


def _close_client(request: web.BaseRequest) -> None:
    # The rest of an oversized body is not read: close the connection after the 413.
    request.protocol.close()


async def _relay(
    request: web.BaseRequest,
    ctx: RequestContext,
    upstream: aiohttp.ClientResponse,
    extra_headers: Sequence[tuple[str, str]],
) -> web.StreamResponse:
    """Send the upstream's response; it is complete (or cut off) when this returns."""
    status = upstream.status
    headers = client_response_headers(upstream.headers)
    for name, value in extra_headers:
        headers[name] = value
    length = upstream.content_length
    no_body = ctx.method == "HEAD" or status in _NO_BODY_STATUS or status < 200
    if no_body:
        response = web.StreamResponse(status=status, reason=upstream.reason, headers=headers)
        if length is not None and ctx.method == "HEAD":
            response.content_length = length
        await response.prepare(request)
        await response.write_eof()
        ctx.body_bytes_sent = 0
        return response
    if length is not None and length <= BUFFER_LIMIT:
        try:
            data = await upstream.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            errorlog.request_event("error", ctx, f"upstream failed while reading response body ({_cause(exc)!s})")
            ctx.upstream_status = ctx.upstream_status or "502"
            return responses.error(
                504 if isinstance(exc, aiohttp.ServerTimeoutError) else 502, request.headers.get("Accept", "")
            )
        ctx.body_bytes_sent = len(data)
        buffered = web.Response(status=status, reason=upstream.reason, headers=headers, body=data)
        await buffered.prepare(request)
        await buffered.write_eof()
        return buffered
    response = web.StreamResponse(status=status, reason=upstream.reason, headers=headers)
    if length is not None:
        response.content_length = length
    await response.prepare(request)
    sent = 0
    try:
        async for chunk, _ in upstream.content.iter_chunks():
            await response.write(chunk)
            sent += len(chunk)
    except (TimeoutError, aiohttp.ClientError) as exc:
        # Headers are gone already: the only honest signal left is to cut the connection.
        ctx.body_bytes_sent = sent
        errorlog.request_event("error", ctx, f"upstream failed while sending response to client ({_cause(exc)!s})")
        if request.transport is not None:
            request.transport.close()
        return response
    ctx.body_bytes_sent = sent
    await response.write_eof()
    return response
