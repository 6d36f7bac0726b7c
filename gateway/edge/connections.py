"""Client connections of one worker: caps at accept, and reuse of stalled ones near the cap.

* The connection budget (``worker_connections``, nginx's name, or less when the open
  file limit allows less: ``settings.connection_budget``) caps the client connections
  of a worker. When a new connection would cross it, the oldest *reusable* connections
  are closed first, as nginx's ``ngx_drain_connections`` does: idle keep-alive
  connections, connections that have not finished sending their header, and TLS
  connections still in their handshake. When none is left, connections whose request
  body arrives slower than ``client_body_min_rate`` (after a first second of grace)
  are closed instead, oldest first. Connections busy otherwise (a body arriving at a
  fair rate, a request waiting on its upstream, a response on its way) are never
  taken. If nothing can be reclaimed, the new connection is refused. Either way the
  operator hears about it once a second:
  ``10240 worker_connections are not enough, reusing connections``.
* At the budget, an address that already holds 1/64th of it (or 8, if more) is
  refused rather than allowed to close other clients' connections: a few addresses
  cannot churn the whole budget, and refusing costs far less than admitting, so the
  accept queue (where a normal client waits) drains fast.
* ``max_connections_per_ip`` caps the connections of one client address, counted
  at accept, before a byte is parsed or a TLS handshake starts. IPv6 peers are
  counted by their /64, the block a single host usually owns. Peers in
  ``real_ip.from`` (load balancers, which legitimately hold many connections) are
  exempt.

Counts are per worker process, like nginx's ``worker_connections``. Nothing here runs
per request but two dictionary operations; the rate of a body is computed only when a
worker is out of room.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gateway.http.realip import ClientAddr, NetworkSet
from gateway.logs import error as errorlog

T = TypeVar("T")
EVICT_BATCH = 32  # nginx drains up to 32 reusable connections at a time
BODY_SCAN = 128  # connections receiving a body looked at, at most, per shortage
FAIR_SHARE = 64  # at the budget, an address holding budget/64 connections gets no more...
MIN_SHARE = 8  # ... or 8, when that is more
GRACE_S = 1.0  # a connection gets this long to show progress before it is reclaimed first


class Evictable(Protocol):
    def evict(self) -> None: ...


class BodyReceiver(Evictable, Protocol):
    def body_progress(self) -> tuple[float, int, bool] | None:
        """(monotonic time the body began, bytes of it received, reading paused by the gateway),
        or None once the whole body is in."""


@dataclass(frozen=True, slots=True)
class ConnectionCaps:
    worker_connections: int  # the budget: worker_connections, or what the open file limit allows
    max_per_ip: int  # 0 = no cap
    exempt: NetworkSet
    limit_name: str = "worker_connections"  # what sets the budget, for the error log
    min_body_rate: int = 0  # client_body_min_rate, bytes per second; 0 = bodies are never reclaimed


def ip_key(addr: ClientAddr) -> bytes:
    """What one client is counted as: its IPv4 address, or its IPv6 /64."""
    return addr.packed if addr.version == 4 else addr.packed[:8]


class _Throttled:
    """An error-log line written at most once a second, with how often it was held back."""

    def __init__(self, level: int) -> None:
        self.level = level
        self._last = 0.0
        self._held = 0

    def log(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last < 1.0:
            self._held += 1
            return
        if self._held:
            message = f"{message} ({self._held} more since the last report)"
        self._last = now
        self._held = 0
        errorlog.log.log(self.level, "%s", message)


class ConnectionLimiter:
    def __init__(self, caps: ConnectionCaps) -> None:
        self.caps = caps
        self.total = 0
        self.per_ip: dict[bytes, int] = {}
        # Reusable connections, with when they became reusable: oldest first (a dict keeps insertion order).
        self.reusable: dict[Evictable, float] = {}
        # Connections busy with a request whose body is still arriving, in the order last looked at.
        self.receiving: dict[BodyReceiver, None] = {}
        self.refused = 0
        self.evicted = 0
        self._not_enough = _Throttled(errorlog.LEVELS["warn"])
        self._exhausted = _Throttled(errorlog.LEVELS["alert"])
        self._per_ip_log = _Throttled(errorlog.LEVELS["warn"])

    def configure(self, caps: ConnectionCaps) -> None:
        """A reload: new caps apply to connections accepted from now on."""
        self.caps = caps

    def admit(self, conn: Evictable, peer: ClientAddr) -> bytes | None:
        """Count a new connection; returns its per-IP key, or None if it must be refused."""
        caps = self.caps
        key = ip_key(peer)
        if caps.max_per_ip and self.per_ip.get(key, 0) >= caps.max_per_ip and peer not in caps.exempt:
            self.refused += 1
            self._per_ip_log.log(
                f"limiting connections by max_connections_per_ip ({caps.max_per_ip}), client: {peer.text}"
            )
            return None
        if self.total >= caps.worker_connections:
            held = self.per_ip.get(key, 0)
            if held >= max(MIN_SHARE, caps.worker_connections // FAIR_SHARE) and peer not in caps.exempt:
                # A full worker and an address with its share already: it waits, others keep theirs.
                self.refused += 1
                self._exhausted.log(
                    f"{caps.worker_connections} {caps.limit_name} are not enough, "
                    f"refusing a connection from a client holding {held}: {peer.text}"
                )
                return None
            self._drain()
            if self.total >= caps.worker_connections:
                self.refused += 1
                self._exhausted.log(f"{caps.worker_connections} {caps.limit_name} are not enough")
                return None
        self.total += 1
        self.per_ip[key] = self.per_ip.get(key, 0) + 1
        self.reusable[conn] = time.monotonic()
        return key

    def release(self, conn: Evictable, key: bytes) -> None:
        """The connection is gone (or is being closed by ``_drain``): give back its counts."""
        self.reusable.pop(conn, None)
        self.receiving.pop(conn, None)  # type: ignore[call-overload]
        self.total -= 1
        left = self.per_ip.get(key, 0) - 1
        if left > 0:
            self.per_ip[key] = left
        else:
            self.per_ip.pop(key, None)

    def busy(self, conn: Evictable) -> None:
        self.reusable.pop(conn, None)

    def receiving_body(self, conn: BodyReceiver) -> None:
        """Busy with a request whose body is still arriving: reclaimable only below the floor rate."""
        self.reusable.pop(conn, None)
        self.receiving[conn] = None

    def body_done(self, conn: BodyReceiver) -> None:
        """The request that was receiving a body is answered (or gone)."""
        self.receiving.pop(conn, None)

    def replace(self, old: Evictable, new: Evictable) -> None:
        """``new`` carries on ``old``'s connection and its counts (a TLS connection after its
        handshake); it starts out reusable, as a connection yet to send its header."""
        self.reusable.pop(old, None)
        self.reusable[new] = time.monotonic()

    def idle(self, conn: Evictable) -> None:
        """Reusable again (waiting for the next request): it goes to the young end."""
        self.reusable.pop(conn, None)
        self.reusable[conn] = time.monotonic()

    def _drain(self) -> None:
        """Close up to a batch of connections that make no progress, in this order:

        1. reusable connections (idle, mid-header, mid-handshake) that have been so for
           ``GRACE_S`` or more, oldest first;
        2. connections whose body is behind ``client_body_min_rate`` (``_slow_bodies``): past
           their first ``GRACE_S``, or else in it;
        3. the oldest reusable connections, however young (nginx's order: a flood of
           half-headers that come and go faster than ``GRACE_S`` is still reclaimed).

        The first two keep a new connection, a normal client's included, from being taken for
        room before it had a chance to send its request, while stalled bodies hold the rest.
        """
        caps = self.caps
        now = time.monotonic()
        stale = now - GRACE_S
        victims: list[Evictable] = []
        for conn, since in self.reusable.items():
            if since > stale or len(victims) >= EVICT_BATCH:
                break
            victims.append(conn)
        what = "reusing connections"
        if not victims and caps.min_body_rate and self.receiving:
            victims = list(self._slow_bodies(caps.min_body_rate, now))
            what = f"closing request bodies slower than client_body_min_rate ({caps.min_body_rate} bytes/s)"
        if not victims:
            victims = list(_first(self.reusable, EVICT_BATCH))
            what = "reusing connections"
        if not victims:
            return
        self._not_enough.log(f"{caps.worker_connections} {caps.limit_name} are not enough, {what}")
        for conn in victims:
            self.evicted += 1
            conn.evict()  # calls release() at once, so the room is there before we return

    def _slow_bodies(self, min_rate: int, now: float) -> list[BodyReceiver]:
        """Up to a batch of connections whose body is behind ``min_rate``, oldest first.

        A body that has received fewer than ``min_rate * (elapsed - GRACE_S)`` bytes is behind
        after its grace; only when none is, one behind ``min_rate * elapsed`` (in its first
        second, already slower than the floor) goes: an attacker opening connections faster
        than the budget per second cannot hide its bodies in their grace. At most
        ``BODY_SCAN`` are looked at; the ones keeping up go to the back, so the next shortage
        looks at others."""
        receiving = self.receiving
        slow: list[BodyReceiver] = []
        lagging: list[BodyReceiver] = []
        allowance = min_rate * GRACE_S
        for conn in list(_first(receiving, BODY_SCAN)):
            progress = conn.body_progress()
            if progress is None:  # the body is in: busy with its upstream, no longer receiving
                del receiving[conn]
                continue
            since, received, paused = progress
            deficit = min_rate * (now - since) - received
            if paused or deficit <= 0:  # keeping up (or the gateway stopped reading it)
                del receiving[conn]
                receiving[conn] = None
            elif deficit > allowance:
                slow.append(conn)
                if len(slow) >= EVICT_BATCH:
                    break
            elif len(lagging) < EVICT_BATCH:
                lagging.append(conn)
        return slow or lagging


def reset(transport: asyncio.Transport) -> None:
    """Close with a TCP reset: under a flood, neither a FIN_WAIT orphan nor a TIME_WAIT is left behind."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    transport.abort()


_LINGER_RESET = struct.pack("ii", 1, 0)


def _first(items: Iterable[T], n: int) -> Iterator[T]:
    for i, item in enumerate(items):
        if i >= n:
            return
        yield item
