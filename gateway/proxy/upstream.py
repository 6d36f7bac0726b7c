"""Upstream pools: keep-alive connections to an upstream group, plus its balancer.

* ``keepalive: N`` caps the idle connections kept for the upstream (like nginx's
  ``keepalive``), not the number of connections in use.
* Each server has its own pool of idle connections, a ``unix:/path`` server too (one per path).
* ``connect_timeout`` bounds the TCP or Unix-socket (and TLS) connect; ``read_timeout`` bounds the
  gap between two reads of the response, like ``proxy_read_timeout``;
  ``send_timeout`` a stalled write of the request body.
* Plain HTTP and WebSocket handshakes go through ``http1`` (our own client).
"""

from __future__ import annotations

from gateway.clock import monotonic_ms
from gateway.config.upstreams import UpstreamSpec
from gateway.proxy.balancer import Balancer
from gateway.proxy.http1 import UpstreamConnections


class UpstreamPool:
    """Everything needed to send requests to one upstream group."""

    def __init__(self, spec: UpstreamSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.balancer = Balancer(spec.servers, monotonic_ms, spec.balance)
        self.connect_timeout = spec.connect_timeout_ms / 1000
        self.read_timeout = spec.read_timeout_ms / 1000
        self.send_timeout = spec.send_timeout_ms / 1000
        self.connections = UpstreamConnections(
            spec.servers,
            spec.keepalive,
            spec.keepalive_timeout_ms / 1000,
            spec.scheme,
            spec.tls_verify,
            spec.tls_ca,
            spec.tls_server_name,
        )
        self.in_flight = 0  # requests (and WebSockets) using this pool now

    @property
    def max_tries(self) -> int:
        return self.spec.next_upstream_tries or len(self.balancer.peers)

    async def close(self) -> None:
        self.connections.close()


class Upstreams:
    """The pools of the running configuration; unchanged upstreams survive a reload."""

    def __init__(self) -> None:
        self.pools: dict[str, UpstreamPool] = {}

    def update(self, specs: dict[str, UpstreamSpec]) -> list[UpstreamPool]:
        """Adopt new specs; returns the pools that are no longer used (to close later)."""
        fresh: dict[str, UpstreamPool] = {}
        for name, spec in specs.items():
            current = self.pools.get(name)
            fresh[name] = current if current is not None and current.spec == spec else UpstreamPool(spec)
        retired = [pool for name, pool in self.pools.items() if fresh.get(name) is not pool]
        self.pools = fresh
        return retired

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()
        self.pools = {}
