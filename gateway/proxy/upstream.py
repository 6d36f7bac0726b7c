"""Upstream pools: keep-alive connections to an upstream group, plus its balancer.

* ``keepalive: N`` caps the idle connections kept for the upstream (like nginx's
  ``keepalive``), not the number of connections in use.
* ``connect_timeout`` bounds the TCP (and TLS) connect; ``read_timeout`` bounds the
  gap between two reads of the response, like ``proxy_read_timeout``;
  ``send_timeout`` a stalled write of the request body.
* Plain HTTP goes through ``http1`` (our own client); WebSocket upgrades through an
  aiohttp session that never decompresses, keeps no cookies and adds no headers.
"""

from __future__ import annotations

import time

import aiohttp
from yarl import URL

from gateway.config.schema import UpstreamSpec
from gateway.proxy.balancer import Balancer, Peer
from gateway.proxy.http1 import UpstreamConnections


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class UpstreamPool:
    """Everything needed to send requests to one upstream group."""

    def __init__(self, spec: UpstreamSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.balancer = Balancer(spec.servers, monotonic_ms)
        self.connect_timeout = spec.connect_timeout_ms / 1000
        self.read_timeout = spec.read_timeout_ms / 1000
        self.send_timeout = spec.send_timeout_ms / 1000
        self.connections = UpstreamConnections(
            spec.keepalive, spec.keepalive_timeout_ms / 1000, spec.scheme, spec.tls_verify
        )
        self._session: aiohttp.ClientSession | None = None
        self.in_flight = 0  # requests (and WebSockets) using this pool now
        self.ssl: bool = spec.tls_verify  # for aiohttp (WebSocket): verify certificates, or not
        self.ws_scheme = "wss" if spec.scheme == "https" else "ws"
        self._ws_bases = {peer.index: f"{self.ws_scheme}://{peer.address}" for peer in self.balancer.peers}

    @property
    def session(self) -> aiohttp.ClientSession:
        """An aiohttp session, for WebSocket upgrades only (plain HTTP uses ``connections``)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self.connect_timeout, sock_connect=self.connect_timeout, sock_read=None
                ),
                trust_env=False,
                max_line_size=65536,
                max_field_size=65536,
            )
        return self._session

    def ws_url(self, peer: Peer, raw_target: str) -> URL:
        return URL(self._ws_bases[peer.index] + raw_target, encoded=True)

    @property
    def max_tries(self) -> int:
        return self.spec.next_upstream_tries or len(self.balancer.peers)

    async def close(self) -> None:
        self.connections.close()
        if self._session is not None:
            await self._session.close()


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
