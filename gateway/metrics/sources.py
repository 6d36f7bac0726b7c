"""The gauges of a serving process, read from live objects at scrape time (never per request)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from gateway.bans.table import BanList
from gateway.clock import monotonic_ms
from gateway.metrics.stats import Stats

if TYPE_CHECKING:
    from gateway.edge.connections import ConnectionLimiter
    from gateway.proxy.upstream import Upstreams


def register_gauges(
    stats: Stats,
    connections: Callable[[], ConnectionLimiter | None],
    banlist: BanList,
    store: Any,
    upstreams: Upstreams,
) -> None:
    def conns() -> Iterator[Sequence[Any]]:
        limiter = connections()
        if limiter is None:
            return
        idle = len(limiter.reusable)
        yield ("active", limiter.total)
        yield ("busy", limiter.total - idle)
        yield ("idle", idle)

    def refused() -> Iterator[Sequence[Any]]:
        limiter = connections()
        if limiter is not None:
            yield (limiter.refused,)

    def circuit() -> Iterator[Sequence[Any]]:
        state = store.status().get("redis_circuit")
        if state is not None:
            yield (1 if state == "open" else 0,)

    def servers_up() -> Iterator[Sequence[Any]]:
        now = monotonic_ms()
        for name, pool in upstreams.pools.items():
            for peer in pool.balancer.peers:
                out = peer.down or (
                    bool(peer.max_fails) and peer.fails >= peer.max_fails and now - peer.checked <= peer.fail_timeout_ms
                )
                yield (name, peer.address, 0 if out else 1)

    def server_conns() -> Iterator[Sequence[Any]]:
        for name, pool in upstreams.pools.items():
            for peer in pool.balancer.peers:
                yield (name, peer.address, peer.conns)

    def gc_field(field: str) -> Callable[[], Iterator[Sequence[Any]]]:
        return lambda: ((str(generation), counts[field]) for generation, counts in enumerate(gc.get_stats()))

    stats.gauge("gateway_connections", conns)
    stats.gauge("gateway_connections_refused_total", refused)
    stats.gauge("gateway_bans_active", lambda: [(len(banlist),)])
    stats.gauge("gateway_redis_circuit_open", circuit)
    stats.gauge("gateway_upstream_server_up", servers_up)
    stats.gauge("gateway_upstream_server_connections", server_conns)
    # the names and meaning of prometheus_client's own GC collector (summed over workers)
    stats.gauge("python_gc_collections_total", gc_field("collections"))
    stats.gauge("python_gc_objects_collected_total", gc_field("collected"))
    stats.gauge("python_gc_objects_uncollectable_total", gc_field("uncollectable"))
