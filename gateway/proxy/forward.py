"""Forwarding one HTTP request to an upstream, like nginx's ``proxy_pass``.

* Request bodies (``proxy_request_buffering on``, the default) are read whole
  before an upstream connection is taken: a client that trickles its body holds
  no upstream connection. The body goes to memory, then to a temp file
  (``spool``), and is sent with a ``Content-Length``. With ``off`` it streams.
* Response bodies (``proxy_buffering on``, the default) are read ahead into
  memory, then a temp file, so the upstream connection is free as soon as the
  upstream has sent everything, whatever the client's speed; the client still
  gets every byte as soon as it can take it. With ``off`` (or the upstream's
  ``X-Accel-Buffering: no``) a slow client holds the upstream back, and the status
  line and every byte go to the client as they arrive. Buffered responses with a
  small known length are read whole and written at once.
* ``proxy_next_upstream error timeout``: which servers are tried, when a failed
  try moves on, and what is recorded about them is ``nextupstream.py``'s, shared
  with WebSocket handshakes.
* Outcomes: refused/down -> 502 at once; timeout -> 504; body over
  ``client_max_body_size`` -> 413; body too slow (``client_body_timeout``,
  ``client_body_deadline``) -> 408; no room for a buffered body -> 500.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web
from multidict import CIMultiDictProxy

from gateway.http import responses
from gateway.http.context import RequestContext
from gateway.logs import error as errorlog
from gateway.proxy.balancer import Peer
from gateway.proxy.clientbody import BodyTooLarge, ClientBodyError, ClientBodyTimeout, RequestBody
from gateway.proxy.headers import request_head
from gateway.proxy.http1 import ResponseHead, UpstreamFailure
from gateway.proxy.nextupstream import NextUpstream
from gateway.proxy.respond import Head, ProxiedResponse, send, writer_of
from gateway.proxy.rewrite import UpstreamRewrite, forwarded_target
from gateway.proxy.spool import BufferPolicy, RequestSpool, ResponseSpool
from gateway.proxy.upstream import UpstreamPool

BUFFER_LIMIT = 256 * 1024  # a response with a Content-Length up to this is read whole, then written at once
DEFAULT_BUFFERS = BufferPolicy()
_NO_BODY_STATUS = frozenset({204, 304})


class SpoolFailed(Exception):
    """The buffered request body could not be kept (no room in ``temp_path``)."""


async def _read_whole(body: RequestBody, spool: RequestSpool) -> None:
    try:
        async for chunk in body:
            spool.write(chunk)
    except OSError as exc:  # from the spool: the client's own errors arrive as ClientBodyError
        raise SpoolFailed(f"could not buffer the request body to a temp file ({exc})") from exc


def _body_failed(
    request: web.BaseRequest, ctx: RequestContext, accept: str, exc: Exception, max_body: int
) -> web.StreamResponse:
    """The response to a request whose body could not be read (or kept)."""
    if isinstance(exc, BodyTooLarge):
        errorlog.request_event("error", ctx, f"client intended to send too large body: more than {max_body} bytes")
        request.protocol.close()  # the rest of the body is not read: no keep-alive after the 413
        return responses.error(413, accept, "request body too large")
    if isinstance(exc, ClientBodyTimeout):
        errorlog.request_event("info", ctx, str(exc))
        request.protocol.close()
        return responses.error(408, accept, "request body timed out")
    if isinstance(exc, SpoolFailed):
        errorlog.request_event("error", ctx, str(exc))
        request.protocol.close()
        return responses.error(500, accept)
    errorlog.request_event("info", ctx, f"client prematurely closed connection while sending body ({exc})")
    return responses.error(400, accept, "client closed the request body early")


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
    buffers: BufferPolicy = DEFAULT_BUFFERS,
    rewrite: UpstreamRewrite | None = None,
) -> web.StreamResponse:
    """``rewrite``: the route's ``uri`` and ``proxy_set_header`` (None: the request as it came).
    A request without a body goes straight to ``_forward``, past the body checks."""
    if not request.body_exists:
        return await _forward(
            request, ctx, pool, headers, max_body, extra_headers, trusted_peer, buffers, None, rewrite
        )
    accept = headers.get("Accept", "")
    length = request.content_length
    if max_body and length is not None and length > max_body:
        errorlog.request_event("error", ctx, f"client intended to send too large body: {length} bytes")
        return responses.error(413, accept, "request body too large")
    stream = RequestBody(request, max_body, body_timeout, buffers.client_body_deadline_s)
    if not buffers.request_buffering:
        return await _forward(
            request, ctx, pool, headers, max_body, extra_headers, trusted_peer, buffers, stream, rewrite
        )
    spool = RequestSpool(buffers.client_body_buffer_size, buffers.temp_path)
    try:
        try:
            await _read_whole(stream, spool)
        except (BodyTooLarge, ClientBodyError, SpoolFailed) as exc:
            return _body_failed(request, ctx, accept, exc, max_body)
        return await _forward(
            request, ctx, pool, headers, max_body, extra_headers, trusted_peer, buffers, spool, rewrite
        )
    finally:
        spool.close()  # the temp file, if any, goes with it


async def _forward(
    request: web.BaseRequest,
    ctx: RequestContext,
    pool: UpstreamPool,
    headers: CIMultiDictProxy[str],
    max_body: int,
    extra_headers: Sequence[tuple[str, str]],
    trusted_peer: bool,
    buffers: BufferPolicy,
    body: RequestBody | RequestSpool | None,
    rewrite: UpstreamRewrite | None,
) -> web.StreamResponse:
    """Try the upstream's servers in turn with a body that is streamed, buffered or absent."""
    target, set_fields = (forwarded_target(ctx), None) if rewrite is None else rewrite.apply(ctx)
    accept = headers.get("Accept", "")
    buffered = isinstance(body, RequestSpool)
    chunked = body is not None and not buffered and request.content_length is None
    host = pool.spec.host or ctx.upstream_host  # an absolute-form target's authority
    per_peer = host is None and "Host" not in headers  # HTTP/1.0 without Host: each server's own

    def head_with(host_override: str | None) -> bytes:
        return request_head(
            ctx.method,
            target,
            headers,
            peer_ip=ctx.peer.text,
            client_ip=ctx.client.text,
            trusted_peer=trusted_peer,
            scheme=ctx.scheme,
            host_override=host_override,
            content_length=body.size if isinstance(body, RequestSpool) else request.content_length,
            chunked=chunked,
            set_fields=set_fields,
        )

    head = b"" if per_peer else head_with(host)
    head_for = (lambda peer: head_with(own_host(pool, peer))) if per_peer else None
    tries = NextUpstream(pool, ctx)
    try:
        answer = await tries.answer(head, body, chunked, buffers, head_for=head_for)
    except (BodyTooLarge, ClientBodyError) as exc:
        ctx.upstream_addr = ", ".join(tries.addrs)
        return _body_failed(request, ctx, accept, exc, max_body)
    if answer is None:
        return tries.no_answer(accept)
    _, spool, response = answer
    try:
        return await relay(request, ctx, spool, response, pool, extra_headers)
    finally:
        spool.close()
        tries.finish()


def own_host(pool: UpstreamPool, peer: Peer) -> str:
    """A server's own ``Host``: its address, without the scheme's default port (nginx's $proxy_host);
    ``localhost`` for a ``unix:`` socket, as nginx's ``proxy_pass http://unix:/path:``."""
    spec = peer.spec
    if spec.path is not None:
        return "localhost"
    default = 443 if pool.spec.scheme == "https" else 80
    host = f"[{spec.host}]" if ":" in spec.host else spec.host
    return host if spec.port == default else f"{host}:{spec.port}"


async def relay(
    request: web.BaseRequest,
    ctx: RequestContext,
    spool: ResponseSpool,
    upstream: ResponseHead,
    pool: UpstreamPool,
    extra_headers: Sequence[tuple[str, str]],
) -> web.StreamResponse:
    """Send the upstream's response; it is complete (or cut off) when this returns.

    The header is composed as bytes and written by us (gateway/proxy/respond.py), then the
    body through the request's own aiohttp writer (its chunked framing, its drain)."""
    status = upstream.status
    head = Head(upstream.headers, extra_headers)
    length = head.length
    if head.accel is not None:  # for us, not for the client (as nginx)
        spool.set_buffering(head.accel.strip().lower() != b"no")
    route = ctx.route
    if route is not None and route.add_header:
        head.add(route.add_header, status, ctx)
    read_timeout = pool.read_timeout
    writer = writer_of(request)
    version = request.version
    keep_alive = request.keep_alive
    try:
        is_head = ctx.method == "HEAD"
        if is_head or status in _NO_BODY_STATUS:
            data, keep_alive, _ = head.compose(
                version, keep_alive, status, upstream.reason, length, no_body=True, head=is_head
            )
            spool.finish()
            spool.close()
            ctx.body_bytes_sent = 0
            ctx.last_write()
            send(writer, data)
            await writer.drain()
            return ProxiedResponse(status, upstream.reason, keep_alive)
        if length is not None and length <= BUFFER_LIMIT and spool.buffering:
            spool.expect_whole(length)
            body = spool.whole()
            if body is None:
                try:
                    body = b"".join([chunk async for chunk in spool.chunks(read_timeout)])
                except UpstreamFailure as exc:
                    errorlog.request_event("error", ctx, f"{exc} while reading the response body from upstream")
                    spool.abort()
                    return responses.error(504 if exc.timeout else 502, request.headers.get("Accept", ""))
            spool.finish()
            spool.close()
            data, keep_alive, _ = head.compose(
                version, keep_alive, status, upstream.reason, len(body), no_body=False, head=False
            )
            ctx.body_bytes_sent = len(body)
            ctx.last_write()
            send(writer, data, body)
            await writer.drain()
            return ProxiedResponse(status, upstream.reason, keep_alive)
        data, keep_alive, chunked = head.compose(
            version, keep_alive, status, upstream.reason, length, no_body=False, head=False
        )
        response = ProxiedResponse(status, upstream.reason, keep_alive)
        writer.length = length
        if chunked:
            writer.enable_chunking()
        send(writer, data)
        sent = 0
        try:
            async for chunk in spool.chunks(read_timeout):
                if length is not None and sent + len(chunk) >= length:
                    ctx.last_write()  # the chunk that completes the declared length
                await writer.write(chunk)
                sent += len(chunk)
        except UpstreamFailure as exc:
            # Headers are gone already: the only honest signal left is to cut the connection.
            ctx.body_bytes_sent = sent
            errorlog.request_event("error", ctx, f"{exc} while sending the response to the client")
            spool.abort()
            if request.transport is not None:
                request.transport.close()
            return response
        ctx.body_bytes_sent = sent
        spool.finish()
        spool.close()  # before the last bytes go: nothing is left on disk once the client has it all
        ctx.last_write()  # (a chunked body's terminator)
        await writer.write_eof()
        return response
    except BaseException:
        spool.abort()  # the client went away (or we were cancelled) mid-response
        raise
