"""WebSocket pass-through, the way nginx does it.

The client's handshake goes to the upstream through our own HTTP/1.1 client
(``Connection: upgrade`` and ``Upgrade: websocket`` set by us, the client's
Sec-WebSocket-* headers as they are, forwarding headers as for any request).
Then, on the upstream's answer:

* 101: the client gets a 101 with the upstream's headers (Set-Cookie,
  Sec-WebSocket-Accept/-Protocol/-Extensions ...), and from then on the two
  connections are one tunnel of raw bytes (``tunnel``): no frame parsing, no
  message size limit, backpressure both ways. It ends when either side closes or
  after ``read_timeout`` without a byte either way (nginx's ``proxy_read_timeout``
  on upgraded connections). The access log says 101, ``$body_bytes_sent`` being
  the bytes tunnelled to the client.
* anything else (a redirect, a 401, a 503 ...): relayed whole, status, headers
  and body, like any proxied response. A redirect is never followed.

Which servers are tried, when a failure moves on, and what is recorded (the
``$upstream_*`` variables, the error log, ``gateway_upstream_duration_seconds``: the
handshake's time, up to the 101) is ``nextupstream.py``'s, as for plain requests.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web
from multidict import CIMultiDict

from gateway.http import responses
from gateway.http.context import RequestContext
from gateway.logs import error as errorlog
from gateway.proxy.forward import DEFAULT_BUFFERS, relay
from gateway.proxy.headers import request_head, switch_response_headers
from gateway.proxy.http1 import Connection, ResponseHead
from gateway.proxy.nextupstream import NextUpstream
from gateway.proxy.rewrite import UpstreamRewrite, forwarded_target
from gateway.proxy.spool import BufferPolicy
from gateway.proxy.tunnel import End, Tunnel
from gateway.proxy.upstream import UpstreamPool


class SwitchingProtocols(web.StreamResponse):
    """The upstream's 101 for the client: no framing headers and no body; after it the
    connection carries the tunnel's bytes, and it closes when the tunnel ends."""

    _length_check = False  # neither Content-Length nor chunked framing

    def __init__(self, reason: str, headers: CIMultiDict[str]) -> None:
        super().__init__(status=101, reason=reason or None, headers=headers)
        self.force_close()

    async def write_eof(self, data: bytes = b"") -> None:
        # Nothing follows a 101 in HTTP: the tunnel has had the connection's bytes.
        self._eof_sent = True


async def forward_websocket(
    request: web.BaseRequest,
    ctx: RequestContext,
    pool: UpstreamPool,
    extra_headers: Sequence[tuple[str, str]] = (),
    *,
    trusted_peer: bool,
    buffers: BufferPolicy = DEFAULT_BUFFERS,
    rewrite: UpstreamRewrite | None = None,
) -> web.StreamResponse:
    accept = ctx.headers.get("Accept", "")
    if request.body_exists:
        refused = responses.error(400, accept, "a WebSocket handshake has no body")
        refused.force_close()  # the body was not read
        return refused
    target, set_fields = (forwarded_target(ctx), None) if rewrite is None else rewrite.apply(ctx)
    head = request_head(
        ctx.method,
        target,
        ctx.headers,
        peer_ip=ctx.peer.text,
        client_ip=ctx.client.text,
        trusted_peer=trusted_peer,
        scheme=ctx.scheme,
        host_override=pool.spec.host or ctx.upstream_host,
        content_length=None,
        chunked=False,
        set_fields=set_fields,
        upgrade=True,
    )
    tries = NextUpstream(pool, ctx)
    answer = await tries.answer(head, None, False, buffers, upgrade=True)
    if answer is None:
        return tries.no_answer(accept)
    conn, spool, response = answer
    try:
        if response.status != 101:
            return await relay(request, ctx, spool, response, pool, extra_headers)
        spool.close()  # a tunnel has no response body to spool
        tries.switched()
        return await _tunnel(request, ctx, conn, response, pool, extra_headers)
    finally:
        spool.close()
        tries.finish()


async def _tunnel(
    request: web.BaseRequest,
    ctx: RequestContext,
    conn: Connection,
    answer: ResponseHead,
    pool: UpstreamPool,
    extra_headers: Sequence[tuple[str, str]],
) -> web.StreamResponse:
    headers = switch_response_headers(answer.headers)
    for name, value in extra_headers:
        headers[name] = value
    response = SwitchingProtocols(answer.reason, headers)
    try:
        await response.prepare(request)
        tunnel = Tunnel(request.protocol, request.writer, pool.read_timeout)
    except BaseException:
        conn.close()
        raise
    ctx.status = 101  # sent: however the tunnel ends, this is what the access log says
    try:
        end = await tunnel.run(conn)
    finally:
        ctx.body_bytes_sent = tunnel.sent_to_client
    if end is End.IDLE:
        errorlog.request_event(
            "error", ctx, f"upstream timed out (no data for {pool.read_timeout:g}s) while proxying upgraded connection"
        )
    return response
