"""Upstream pools: one aiohttp client session per upstream, plus its balancer.

* ``keepalive: N`` caps the idle connections kept for the upstream (like nginx's
  ``keepalive``), not the number of connections in use.
* ``connect_timeout`` bounds the TCP (and TLS) connect; ``read_timeout`` bounds the
  gap between two reads of the response, like ``proxy_read_timeout``.
* The session never decompresses, never keeps cookies and adds no headers of its
  own (no User-Agent, Accept or Content-Type the client did not send).
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from yarl import URL

from gateway.config.schema import UpstreamSpec
from gateway.proxy.balancer import Balancer, Peer


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class _CappedConnector(aiohttp.TCPConnector):
    """A connector that closes idle connections beyond ``idle_cap`` (nginx's keepalive N)."""

    def __init__(self, *, idle_cap: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._idle_cap = idle_cap

    def _release(self, key: Any, protocol: Any, *, should_close: bool = False) -> None:
        super()._release(key, protocol, should_close=should_close)
        pools = getattr(self, "_conns", None)
        if not pools:
            return
        idle = sum(len(conns) for conns in pools.values())
        conns = pools.get(key)
        while conns and idle > self._idle_cap:
            proto, _ = conns.popleft()
            proto.close()
            idle -= 1
        if conns is not None and not conns:
            pools.pop(key, None)


class UpstreamPool:
    """Everything needed to send requests to one upstream group."""

    def __init__(self, spec: UpstreamSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.balancer = Balancer(spec.servers, monotonic_ms)
        if spec.keepalive > 0:
            connector: aiohttp.TCPConnector = _CappedConnector(
                idle_cap=spec.keepalive,
                limit=0,
                limit_per_host=0,
                keepalive_timeout=spec.keepalive_timeout_ms / 1000 or None,
                enable_cleanup_closed=False,
                ttl_dns_cache=10,
            )
        else:
            connector = aiohttp.TCPConnector(limit=0, force_close=True)
        connect_s = spec.connect_timeout_ms / 1000
        self.timeout = aiohttp.ClientTimeout(
            total=None,
            connect=connect_s,
            sock_connect=connect_s,
            sock_read=spec.read_timeout_ms / 1000,
            ceil_threshold=3600,
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            timeout=self.timeout,
            trust_env=False,
            raise_for_status=False,
            requote_redirect_url=False,
            max_line_size=65536,
            max_field_size=65536,
            read_bufsize=2**16,
        )
        self.ssl: bool = spec.tls_verify  # True: verify certificates (the default); False: do not
        self.ws_scheme = "wss" if spec.scheme == "https" else "ws"
        self._bases = {peer.index: f"{spec.scheme}://{peer.address}" for peer in self.balancer.peers}
        self._ws_bases = {peer.index: f"{self.ws_scheme}://{peer.address}" for peer in self.balancer.peers}

    def url(self, peer: Peer, raw_target: str) -> URL:
        return URL(self._bases[peer.index] + raw_target, encoded=True)

    def ws_url(self, peer: Peer, raw_target: str) -> URL:
        return URL(self._ws_bases[peer.index] + raw_target, encoded=True)

    @property
    def max_tries(self) -> int:
        return self.spec.next_upstream_tries or len(self.balancer.peers)

    async def close(self) -> None:
        await self.session.close()


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
