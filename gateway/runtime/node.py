"""What a node serves beside traffic, wired once for a single process or a master.

A node is one ``gateway run``: a single serving process (``server.py``), or the master of
``workers: N`` (``supervisor.py``), whose workers serve traffic only. Beside the traffic a
node keeps the manual bans (``open_bans``) and, where it is the one that answers operators
(never a worker), serves the admin API, with the zone state reader of its store, and the
``metrics.listen`` listener. ``Node`` starts them in that order and closes them in the
reverse order; the process that owns it says when, and answers the admin API's calls
(``NodeOwner``).
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from aiohttp import web

from gateway.admin.api import AdminApi, ReloadReply, serve_admin
from gateway.admin.metrics_listener import serve_metrics
from gateway.bans.database import BanDatabase
from gateway.bans.local import LocalBans
from gateway.bans.redis import RedisBans
from gateway.bans.table import BanList
from gateway.config.schema import ConfigSpec
from gateway.logs import error as errorlog
from gateway.metrics import MetricsHub
from gateway.metrics.stats import STATS
from gateway.plan.compiled import CompiledConfig
from gateway.store.base import Store
from gateway.store.factory import SOCKET_ENV
from gateway.store.inspect import MemoryZoneState, ZoneState
from gateway.store.memory import MemoryStore


class NodeOwner(Protocol):
    """The process a ``Node`` belongs to: what the admin API reads and calls on it."""

    @property
    def config(self) -> CompiledConfig:
        """The configuration in force (a reload replaces it)."""

    @property
    def store(self) -> Store | None:
        """The node's limit store (None: the master of Redis-backed workers holds none)."""

    async def reload(self) -> ReloadReply:
        """``POST /reload``: like SIGHUP."""

    def status(self) -> dict[str, Any]:
        """``GET /status``, beside the version, pid and uptime."""

    def serving(self) -> bool:
        """``GET /readyz``: whether traffic is being served (not starting, not shutting down)."""

    async def activity_status(self) -> dict[str, Any]:
        """``GET /status/activity``: the status page's data."""


class Node:
    """The bans of one node, and (where it serves them) its admin API and metrics listener."""

    def __init__(self, spec: ConfigSpec, store: Store | None, banlist: BanList, *, follow: bool) -> None:
        self.bans = open_bans(spec, store, banlist, follow=follow)
        self.admin: AdminApi | None = None
        self.metrics_runner: web.AppRunner | None = None

    async def start(self, owner: NodeOwner, metrics: MetricsHub, *, serve: bool = True) -> None:
        """Start keeping the bans; with ``serve`` (not a worker of a master), the admin API (when
        there are bans to manage and ``admin.listen`` is set) and the ``metrics.listen`` listener.
        A listener that cannot bind is logged and left out; the node runs without it.

        The embedded store's bans are read from their database here, before the caller opens
        its listeners (BanStoreError, naming the file, when it cannot be used)."""
        if self.bans is not None:
            await self.bans.start()
            if isinstance(self.bans, LocalBans) and self.bans.database is not None:
                errorlog.log.log(
                    errorlog.NOTICE, "%d bans in force loaded from %s", self.bans.loaded, self.bans.database.path
                )
            if isinstance(self.bans, RedisBans) and self.bans.following:
                bans = self.bans
                STATS.gauge("gateway_bans_restored_total", lambda: [[bans.restored_total]])
        if not serve:
            return
        spec = owner.config.spec
        if self.bans is not None and spec.admin.listen is not None:
            self.admin = await serve_admin(
                spec,
                self.bans,
                owner.reload,
                owner.status,
                config=lambda: owner.config.spec,
                serving=owner.serving,
                activity=owner.activity_status,
                zone_state=zone_state(owner),
                metrics=metrics.render,
            )
        if spec.metrics.listen is not None:
            self.metrics_runner = await serve_metrics(spec.metrics.listen, metrics)

    async def close(self) -> None:
        """Stop the metrics listener, then the admin API, then the bans."""
        if self.metrics_runner is not None:
            await self.metrics_runner.cleanup()
            self.metrics_runner = None
        if self.admin is not None:
            await self.admin.close()
            self.admin = None
        if self.bans is not None:
            await self.bans.close()


def open_bans(spec: ConfigSpec, store: Store | None, banlist: BanList, *, follow: bool) -> LocalBans | RedisBans | None:
    """Where this process reads and writes manual bans (None: it only receives them).

    ``follow``: keep ``banlist`` current from Redis (serving processes); the master of
    several Redis-backed workers only needs to write, so it does not follow.
    """
    redis_spec = spec.store.redis
    if redis_spec is not None:
        from gateway.bans.redis import SYNC_TIMEOUT_S
        from gateway.store.redis import connect

        # Its own connections and deadline: reading a long list must not wait on, nor be cut
        # short by, the request path's timeout.
        return RedisBans(
            connect(redis_spec, SYNC_TIMEOUT_S),
            redis_spec.prefix.encode(),
            banlist,
            sync_interval_s=spec.bans.sync_interval_ms / 1000,
            subscriber=(lambda: connect(redis_spec, None)) if follow else None,
            owns_client=True,
        )
    if os.environ.get(SOCKET_ENV):
        return None  # a worker: the master owns the bans and pushes them here
    return LocalBans(banlist, BanDatabase(spec.state_dir))  # kept in state_dir: a restart loses none


def zone_state(owner: NodeOwner) -> ZoneState | None:
    """Where the admin API reads and resets one key's limit state: the embedded store this node
    holds, or Redis (with the configuration in force); None: neither (a worker's client)."""
    if isinstance(owner.store, MemoryStore):
        return MemoryZoneState(owner.store)
    if owner.config.spec.store.redis is not None:
        from gateway.store.redis.inspect import RedisZoneState

        return RedisZoneState(lambda: owner.config.spec)
    return None


def node_status(
    config: CompiledConfig, store: Store | None, banlist: BanList, bans: LocalBans | RedisBans | None = None
) -> dict[str, Any]:
    """What /status reports about this node's limits."""
    status: dict[str, Any] = {
        "store": store.kind if store is not None else "redis",  # None: a master of Redis-backed workers
        "routes": len(config.routes),
        "bans": len(banlist),
    }
    if bans is not None:
        status["ban_list"] = bans.status()  # count, and when it was last known current
    if store is not None:
        status.update(store.status())
    return status
