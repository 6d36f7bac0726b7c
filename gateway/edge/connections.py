"""Client connections of one worker: caps at accept, and reuse of idle ones near the cap.

* ``worker_connections`` (nginx's name) caps the client connections of a worker.
  When a new connection would cross it, the oldest *reusable* connections are
  closed first, as nginx's ``ngx_drain_connections`` does: idle keep-alive
  connections and connections that have not finished sending their header.
  Connections busy with a request are never taken. If none can be reused, the new
  connection is refused. Either way the operator hears about it once a second:
  ``10240 worker_connections are not enough, reusing connections``.
* ``max_connections_per_ip`` caps the connections of one client address, counted
  at accept, before a byte is parsed. IPv6 peers are counted by their /64, the
  block a single host usually owns. Peers in ``real_ip.from`` (load balancers,
  which legitimately hold many connections) are exempt.

Counts are per worker process, like nginx's ``worker_connections``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from gateway.http.realip import ClientAddr, NetworkSet
from gateway.logs import error as errorlog

EVICT_BATCH = 32  # nginx drains up to 32 reusable connections at a time


class Evictable(Protocol):
    def evict(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ConnectionCaps:
    worker_connections: int
    max_per_ip: int  # 0 = no cap
    exempt: NetworkSet


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
        # Reusable connections, oldest first (a dict keeps insertion order).
        self.reusable: dict[Evictable, None] = {}
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
            self._drain()
            if self.total >= caps.worker_connections:
                self.refused += 1
                self._exhausted.log(f"{caps.worker_connections} worker_connections are not enough")
                return None
        self.total += 1
        self.per_ip[key] = self.per_ip.get(key, 0) + 1
        self.reusable[conn] = None
        return key

    def release(self, conn: Evictable, key: bytes) -> None:
        """The connection is gone (or is being closed by ``_drain``): give back its counts."""
        self.reusable.pop(conn, None)
        self.total -= 1
        left = self.per_ip.get(key, 0) - 1
        if left > 0:
            self.per_ip[key] = left
        else:
            self.per_ip.pop(key, None)

    def busy(self, conn: Evictable) -> None:
        self.reusable.pop(conn, None)

    def idle(self, conn: Evictable) -> None:
        """Reusable again (waiting for the next request): it goes to the young end."""
        self.reusable.pop(conn, None)
        self.reusable[conn] = None

    def _drain(self) -> None:
        victims = list(_first(self.reusable, EVICT_BATCH))
        if not victims:
            return
        self._not_enough.log(f"{self.caps.worker_connections} worker_connections are not enough, reusing connections")
        for conn in victims:
            self.evicted += 1
            conn.evict()  # calls release() at once, so the room is there before we return


def _first(items: dict[Evictable, None], n: int) -> Iterator[Evictable]:
    for i, item in enumerate(items):
        if i >= n:
            return
        yield item
