"""Forwarding one HTTP request to an upstream, like nginx's ``proxy_pass``.

* Bodies stream both ways; neither is held in memory (small responses with a
  known length are read whole, which is faster and bounded).
* ``proxy_next_upstream error timeout``: a connect failure or connect timeout moves
  on to the next server for any method (nothing was sent). An error or timeout
  after the request went out is retried only for idempotent requests whose body
  was not read yet. Failures feed the balancer's ``max_fails``. A pooled
  connection the upstream had already closed is replaced once, without counting
  as a failure (the upstream's keep-alive ended, the server is fine).
* Outcomes: refused/down -> 502 at once; timeout -> 504; body over
  ``client_max_body_size`` -> 413.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from gateway import errorlog, responses
from gateway.context import RequestContext
from gateway.proxy.balancer import Peer
from gateway.proxy.headers import request_head, response_headers
from gateway.proxy.http1 import Connection, ResponseHead, StaleConnection, UpstreamFailure
from gateway.proxy.upstream import UpstreamPool

BUFFER_LIMIT = 256 * 1024
NON_IDEMPOTENT = frozenset({"POST", "LOCK", "PATCH"})
_NO_BODY_STATUS = frozenset({204, 304})


class BodyTooLarge(Exception):
    pass


class ProxiedResponse(web.StreamResponse):
    """An upstream's response as it was: aiohttp would add a Content-Type to any body
    that has none (RFC 9110 §8.3 asks that of the *generator* of a message, not a proxy)."""

    _upstream_sent_type = True

    async def _write_headers(self) -> None:
        if not self._upstream_sent_type:
            self._headers.popall("Content-Type", None)
        await super()._write_headers()


def _response(status: int, reason: str, headers: CIMultiDict[str]) -> ProxiedResponse:
    response = ProxiedResponse(status=status, reason=reason, headers=headers)
    response._upstream_sent_type = "Content-Type" in headers
    return response


class ClientBodyError(Exception):
    pass


class ClientBodyTimeout(ClientBodyError):
    pass


class RequestBody:
    """The client's body as an async iterator that counts bytes and knows if it was touched."""

    def __init__(self, request: web.BaseRequest, limit: int, timeout: float) -> None:
        self.request = request
        self.limit = limit
        self.timeout = timeout
        self.started = False
        self.received = 0

    async def _chunks(self) -> AsyncIterator[bytes]:
        self.started = True
        if self.request.headers.get("Expect", "").lower() == "100-continue":
            version = self.request.version
            await self.request.writer.write(f"HTTP/{version.major}.{version.minor} 100 Continue\r\n\r\n".encode())
        limit = self.limit
        content = self.request.content
        try:
            while True:
                try:
                    async with asyncio.timeout(self.timeout):
                        chunk = await content.readany()
                except TimeoutError:
                    raise ClientBodyTimeout(f"client timed out ({self.timeout:g}s) while sending the body") from None
                if not chunk:
                    return
                self.received += len(chunk)
                if limit and self.received > limit:
                    raise BodyTooLarge()
                yield chunk
        except ClientBodyTimeout:
            raise
        except (ConnectionError, OSError) as exc:
            raise ClientBodyError(str(exc)) from exc
        except Exception as exc:  # aiohttp's payload errors (truncated or malformed chunked body)
            if isinstance(exc, BodyTooLarge):
                raise
            raise ClientBodyError(str(exc)) from exc

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()


async def forward_http(
    request: web.BaseRequest,
    ctx: RequestContext,
    pool: UpstreamPool,
    headers: CIMultiDictProxy[str],
    max_body: int,
    extra_headers: Sequence[tuple[str, str]] = (),
    *,
    trusted_peer: bool,
    body_timeout: float = 60.0,
) -> web.StreamResponse:
    accept = headers.get("Accept", "")
    length = request.content_length
    if max_body and length is not None and length > max_body:
        errorlog.request_event("error", ctx, f"client intended to send too large body: {length} bytes")
        return responses.error(413, accept, "request body too large")
    body = RequestBody(request, max_body, body_timeout) if request.body_exists else None
    chunked = body is not None and length is None
    head = request_head(
        ctx.method,
        ctx.raw_target,
        headers,
        peer_ip=ctx.peer.text,
        client_ip=ctx.client.text,
        trusted_peer=trusted_peer,
        scheme=ctx.scheme,
        host_override=pool.spec.host,
        content_length=length,
        chunked=chunked,
    )
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
            conn, response = await _exchange(pool, peer, head, body, chunked)
        except BodyTooLarge:
            ctx.upstream_addr = ", ".join(addrs)
            errorlog.request_event("error", ctx, f"client intended to send too large body: more than {max_body} bytes")
            request.protocol.close()  # the rest of the body is not read: no keep-alive after the 413
            return responses.error(413, accept, "request body too large")
        except ClientBodyTimeout as exc:
            ctx.upstream_addr = ", ".join(addrs)
            errorlog.request_event("info", ctx, str(exc))
            request.protocol.close()
            return responses.error(408, accept, "request body timed out")
        except ClientBodyError as exc:
            ctx.upstream_addr = ", ".join(addrs)
            errorlog.request_event("info", ctx, f"client prematurely closed connection while sending body ({exc})")
            return responses.error(400, accept, "client closed the request body early")
        except UpstreamFailure as exc:
            timed_out = exc.timeout
            statuses.append("504" if timed_out else "502")
            ctx.upstream_addr = peer.address
            errorlog.request_event("error", ctx, f"{exc} while talking to upstream")
            if balancer.report(peer, failed=True):
                errorlog.log.warning(
                    'upstream server temporarily disabled: %s in upstream "%s"', peer.address, pool.name
                )
            if exc.phase != "connect" and (method in NON_IDEMPOTENT or (body is not None and body.started)):
                break  # the request may have reached the upstream: replaying it is not safe
            continue
        balancer.report(peer, failed=False)
        statuses.append(str(response.status))
        ctx.upstream_addr = ", ".join(addrs)
        ctx.upstream_status = ", ".join(statuses)
        try:
            return await _relay(request, ctx, conn, response, pool, extra_headers)
        finally:
            ctx.upstream_time = f"{time.monotonic() - started:.3f}"
    ctx.upstream_addr = ", ".join(addrs)
    ctx.upstream_status = ", ".join(statuses)
    ctx.upstream_time = f"{time.monotonic() - started:.3f}" if addrs else ""
    if not addrs:
        errorlog.request_event("error", ctx, f'no live upstreams while connecting to upstream "{pool.name}"')
    return responses.error(504 if timed_out else 502, accept)


async def _exchange(
    pool: UpstreamPool, peer: Peer, head: bytes, body: RequestBody | None, chunked: bool
) -> tuple[Connection, ResponseHead]:
    """Send the request on a pooled (or new) connection and read the response head."""
    peer_pool = pool.connections.peer(peer.spec.host, peer.spec.port)
    for attempt in range(2):
        conn = await peer_pool.acquire(pool.connect_timeout, fresh=attempt > 0)
        try:
            await conn.send(head, body, chunked, pool.send_timeout)
            return conn, await conn.read_head(pool.read_timeout)
        except StaleConnection:
            conn.close()
            if body is not None and body.started:
                raise
            continue  # the upstream had closed this idle connection: one more try, on a fresh one
        except BaseException:
            conn.close()
            raise
    raise StaleConnection("upstream closed two connections in a row before answering")


async def _relay(
    request: web.BaseRequest,
    ctx: RequestContext,
    conn: Connection,
    upstream: ResponseHead,
    pool: UpstreamPool,
    extra_headers: Sequence[tuple[str, str]],
) -> web.StreamResponse:
    """Send the upstream's response; it is complete (or cut off) when this returns."""
    status = upstream.status
    headers, length = response_headers(upstream.headers)
    for name, value in extra_headers:
        headers[name] = value
    read_timeout = pool.read_timeout
    try:
        no_body = ctx.method == "HEAD" or status in _NO_BODY_STATUS
        if no_body:
            response = _response(status, upstream.reason, headers)
            if length is not None and ctx.method == "HEAD":
                response.content_length = length
            await response.prepare(request)
            await response.write_eof()
            ctx.body_bytes_sent = 0
            conn.finish()
            return response
        if length is not None and length <= BUFFER_LIMIT:
            try:
                data = b"".join([chunk async for chunk in conn.body(read_timeout)])
            except UpstreamFailure as exc:
                errorlog.request_event("error", ctx, f"{exc} while reading the response body from upstream")
                conn.close()
                return responses.error(504 if exc.timeout else 502, request.headers.get("Accept", ""))
            conn.finish()
            ctx.body_bytes_sent = len(data)
            # A StreamResponse, not a web.Response: that would invent a Content-Type.
            buffered = _response(status, upstream.reason, headers)
            buffered.content_length = len(data)
            await buffered.prepare(request)
            await buffered.write_eof(data)
            return buffered
        response = _response(status, upstream.reason, headers)
        if length is not None:
            response.content_length = length
        await response.prepare(request)
        sent = 0
        try:
            async for chunk in conn.body(read_timeout):
                await response.write(chunk)
                sent += len(chunk)
        except UpstreamFailure as exc:
            # Headers are gone already: the only honest signal left is to cut the connection.
            ctx.body_bytes_sent = sent
            errorlog.request_event("error", ctx, f"{exc} while sending the response to the client")
            conn.close()
            if request.transport is not None:
                request.transport.close()
            return response
        ctx.body_bytes_sent = sent
        conn.finish()
        await response.write_eof()
        return response
    except BaseException:
        conn.close()  # the client went away (or we were cancelled) mid-response
        raise
