"""nginx's ``proxy_next_upstream error timeout``: one request's way through an upstream's servers.

Plain requests (``forward.py``) and WebSocket handshakes (``websocket.py``) both go
through one ``NextUpstream``, so both follow the same rules and leave the same record:

* The balancer picks a server not tried yet; the request goes out on a pooled (or new)
  connection (``exchange``) and the response head comes back. At most
  ``next_upstream_tries`` servers are tried (default: all of them).
* A connect failure or connect timeout moves on to the next server for any method
  (nothing was sent). An error or timeout after the request went out moves on only
  when replaying it is safe and possible: an idempotent method, and a body that is
  absent or buffered (a streamed body that was read cannot be sent again).
* Every failure is written to the error log and counts against its server
  (``max_fails`` / ``fail_timeout``: a warning when that takes the server out); an
  answer resets the count. A pooled connection that the upstream had already closed
  is replaced once, without counting as a failure (its keep-alive ended, the server
  is fine).
* The record: ``$upstream_addr`` and ``$upstream_status`` list every server tried, in
  order (502 or 504 for one that failed); ``$upstream_response_time`` runs from the
  first try until the response is done (for a WebSocket, until its tunnel ends, as in
  nginx); ``gateway_upstream_duration_seconds{upstream}`` gets the same time, except
  that a WebSocket counts its handshake, up to the upstream's 101, not the tunnel's
  life (a tunnel open for hours says nothing about the upstream's latency).
* No server answered: 504 if the last failure was a timeout, else 502; with no
  server available at all, "no live upstreams" goes to the error log.
* The server being tried counts one connection (``Peer.conns``, what ``least_conn`` compares)
  from its pick until the try fails (before the next server is picked), or else until
  ``finish()``: the response to the client is done or the tunnel closed. Every way out lets it
  go: a failure, the client's body failing, a cancellation (the client went away).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from gateway.http import responses
from gateway.http.context import RequestContext
from gateway.logs import error as errorlog
from gateway.metrics.stats import STATS
from gateway.proxy.balancer import Peer
from gateway.proxy.clientbody import RequestBody
from gateway.proxy.http1 import Connection, ReadTimedOut, ResponseHead, StaleConnection, UpstreamFailure
from gateway.proxy.spool import BufferPolicy, RequestSpool, ResponseSpool
from gateway.proxy.upstream import UpstreamPool

NON_IDEMPOTENT = frozenset({"POST", "LOCK", "PATCH"})

Answer = tuple[Connection, ResponseSpool, ResponseHead]


class NextUpstream:
    """The servers one request tries, and what it records about them (see the module's docstring).

    ``answer()`` returns the first server's answer; the caller relays it (or opens a tunnel)
    and then calls ``finish()``. When no server answered, ``no_answer()`` is the response."""

    __slots__ = ("addrs", "ctx", "held", "observed", "pool", "started", "statuses", "timed_out")

    def __init__(self, pool: UpstreamPool, ctx: RequestContext) -> None:
        self.pool = pool
        self.ctx = ctx
        self.addrs: list[str] = []  # $upstream_addr, one per server tried
        self.statuses: list[str] = []  # $upstream_status, likewise
        self.timed_out = False  # how the last failure ended: 504 rather than 502
        self.started = time.monotonic()
        self.observed = False  # the metric has had its sample (a WebSocket's handshake)
        self.held: Peer | None = None  # the server whose connection count this request holds

    async def answer(
        self,
        head: bytes,
        body: RequestBody | RequestSpool | None,
        chunked: bool,
        buffers: BufferPolicy,
        *,
        head_for: Callable[[Peer], bytes] | None = None,
        upgrade: bool = False,
    ) -> Answer | None:
        """Try servers in turn until one answers with a response head; None when none did.

        ``head_for``: the request head for one server, when it differs per server (an HTTP/1.0
        request without ``Host`` gets each server's own); ``head`` is not used then. The client
        body's own errors (too large, too slow, cut off) are raised as they come."""
        pool = self.pool
        ctx = self.ctx
        balancer = pool.balancer
        addrs = self.addrs
        statuses = self.statuses
        tried: set[int] = set()
        for _attempt in range(pool.max_tries):
            peer = balancer.pick(tried, ctx)
            if peer is None:
                break
            peer.conns += 1
            self.held = peer
            tried.add(peer.index)
            addrs.append(peer.address)
            try:
                if head_for is not None:
                    head = head_for(peer)
                answer = await exchange(pool, peer, head, body, chunked, buffers, ctx, upgrade=upgrade)
            except UpstreamFailure as exc:
                self.release()
                self.timed_out = exc.timeout
                statuses.append("504" if exc.timeout else "502")
                self._failed(peer, exc)
                if exc.phase != "connect" and (ctx.method in NON_IDEMPOTENT or consumed(body)):
                    break  # the request may have reached the upstream: replaying it is not safe (or possible)
                continue
            except BaseException:
                self.release()  # the client's body failed, or the request was cancelled
                raise
            if isinstance(body, RequestSpool):
                body.close()  # sent, and there is an answer: no retry will need it again
            balancer.report(peer, failed=False)
            statuses.append(str(answer[2].status))
            ctx.upstream_addr = ", ".join(addrs)
            ctx.upstream_status = ", ".join(statuses)
            return answer
        return None

    def _failed(self, peer: Peer, exc: UpstreamFailure) -> None:
        """Log an exchange that failed and count it against the server (nginx's max_fails)."""
        ctx = self.ctx
        ctx.upstream_addr = peer.address  # the error log line names this server alone
        errorlog.request_event("error", ctx, f"{exc} while talking to upstream")
        pool = self.pool
        if pool.balancer.report(peer, failed=True):
            errorlog.log.warning('upstream server temporarily disabled: %s in upstream "%s"', peer.address, pool.name)

    def switched(self) -> None:
        """The upstream answered a WebSocket handshake with 101: its time is the metric's sample."""
        STATS.upstream(self.pool.name, time.monotonic() - self.started)
        self.observed = True

    def release(self) -> None:
        """Give back the connection count of the server being tried (at most once)."""
        peer = self.held
        if peer is not None:
            self.held = None
            peer.conns -= 1

    def finish(self) -> None:
        """The response is done (or the tunnel closed): the server's connection count goes back,
        ``$upstream_response_time``, and the metric's sample unless a handshake gave it already."""
        self.release()
        elapsed = time.monotonic() - self.started
        self.ctx.upstream_time = f"{elapsed:.3f}"
        if not self.observed:
            STATS.upstream(self.pool.name, elapsed)

    def no_answer(self, accept: str) -> web.Response:
        """The response when no server answered: 502, or 504 after a timeout."""
        ctx = self.ctx
        ctx.upstream_addr = ", ".join(self.addrs)
        ctx.upstream_status = ", ".join(self.statuses)
        if self.addrs:
            self.finish()
        else:
            ctx.upstream_time = ""
            errorlog.request_event("error", ctx, f'no live upstreams while connecting to upstream "{self.pool.name}"')
        return responses.error(504 if self.timed_out else 502, accept)


def consumed(body: RequestBody | RequestSpool | None) -> bool:
    """A streamed body that was (partly) read cannot be sent again; a buffered one can."""
    return isinstance(body, RequestBody) and body.started


def _read_timed_out() -> Exception:
    return ReadTimedOut("upstream timed out while reading the response body")


def _spill_failed(exc: OSError, ctx: RequestContext) -> None:
    errorlog.request_event(
        "error", ctx, f"could not write the response to a temp file ({exc}); going on at the client's pace"
    )


async def exchange(
    pool: UpstreamPool,
    peer: Peer,
    head: bytes,
    body: RequestBody | RequestSpool | None,
    chunked: bool,
    buffers: BufferPolicy,
    ctx: RequestContext,
    *,
    upgrade: bool = False,
) -> Answer:
    """Send the request on a pooled (or new) connection and read the response head;
    the response body goes to the returned spool (``buffers``: the route's policy). With
    ``upgrade`` (a WebSocket handshake) a 101 answer is the start of a tunnel on the
    returned connection."""
    peer_pool = pool.connections.peers[peer.index]
    for attempt in range(2):
        conn = await peer_pool.acquire(pool.connect_timeout, fresh=attempt > 0)
        if upgrade:
            conn.expect_upgrade()
        spool = ResponseSpool(buffers, _read_timed_out, _spill_failed, ctx)
        try:
            await conn.send(head, body, chunked, pool.send_timeout, spool)
            return conn, spool, await conn.read_head(pool.read_timeout)
        except StaleConnection:
            spool.abort()
            spool.close()
            if consumed(body):
                raise
            continue  # the upstream had closed this idle connection: one more try, on a fresh one
        except BaseException:
            spool.abort()
            spool.close()
            raise
    raise StaleConnection("upstream closed two connections in a row before answering")
