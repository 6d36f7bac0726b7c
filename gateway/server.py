"""One serving process: listeners, the pipeline, reload and graceful shutdown.

Lifecycle:

* start: compile the config, open upstream pools, bind every ``listen`` address
  (with SO_REUSEPORT when several workers share a port);
* SIGHUP (or ``reload()``): load the file again; on any error, log every problem
  and keep serving the old configuration; on success swap the plan in one
  assignment, keeping unchanged upstream pools (and their idle connections);
* SIGTERM / SIGINT: stop accepting, close idle keep-alive connections, let
  in-flight requests finish up to ``shutdown_timeout``, then cancel the rest;
* SIGUSR1: reopen log files, like ``nginx -s reopen``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from typing import Any

from aiohttp import web

from gateway import errorlog
from gateway.accesslog import AccessLog, LogSink, aiohttp_logger_class
from gateway.admin import AdminApi, serve_admin
from gateway.background import spawn
from gateway.bans import BanList, LocalBans, RedisBans, WorkerBans, run_expiry
from gateway.config.offloop import load_config_off_loop, release_off_loop
from gateway.edge import EdgeServer, edge_settings, set_server_tokens
from gateway.errors import ConfigErrors
from gateway.limiting import Limiter
from gateway.overrides import Overrides
from gateway.pipeline import Pipeline
from gateway.plan import CompiledConfig
from gateway.proxy.upstream import UpstreamPool, Upstreams
from gateway.store import make_store, open_bans
from gateway.store.memory import MemoryStore
from gateway.store.shared import SharedStoreClient

log = errorlog.log


class GatewayServer:
    def __init__(
        self, config_path: str, config: CompiledConfig, *, reuse_port: bool = False, overrides: Overrides | None = None
    ) -> None:
        self.config_path = config_path
        self.overrides = overrides
        self.config = config
        self.reuse_port = reuse_port
        self.upstreams = Upstreams()
        self.sink = LogSink(config.spec.log.access)
        self.access_log = AccessLog(config.spec.log.format, self.sink)
        self.store = make_store(config.spec)
        self.store.configure(config.spec.zones)
        self.banlist = BanList()
        self.bans: LocalBans | RedisBans | None = None
        self.admin: AdminApi | None = None
        self.serves_admin = not reuse_port  # with several workers, the master serves it
        self.pipeline = Pipeline(config, self.upstreams, self.access_log, Limiter(self.store), self.banlist)
        self.runner: web.ServerRunner | None = None
        self.edge: EdgeServer | None = None
        self.stopped = asyncio.Event()
        self._expiry: asyncio.Task[Any] | None = None  # a worker's own sweep of ended bans
        self._stopping = False

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        starter = getattr(self.store, "start", None)
        if starter is not None:
            await starter()
        if isinstance(self.store, SharedStoreClient):
            self.store.on_bans = WorkerBans(self.banlist).apply
            self._expiry = spawn(run_expiry(self.banlist))
        self.bans = open_bans(self.config.spec, self.store, self.banlist, follow=True)
        if self.bans is not None:
            await self.bans.start()
        if self.serves_admin and self.bans is not None and self.config.spec.admin.listen is not None:
            await self._start_admin()
        self.upstreams.update(dict(self.config.spec.upstreams))
        set_server_tokens(self.config.spec.edge.server_tokens)
        self.edge = EdgeServer(
            self.pipeline.handle,
            edge_settings(self.config.spec),
            handler_cancellation=True,
            access_log_class=aiohttp_logger_class(lambda: self.access_log),
            access_log=logging.getLogger("gateway.access"),
            auto_decompress=False,
            lingering_time=5.0,
        )
        self.runner = web.ServerRunner(self.edge, shutdown_timeout=self.config.spec.shutdown_timeout_ms / 1000)
        await self.runner.setup()
        for host, port in self.config.spec.listen:
            site = web.SockSite(
                self.runner,
                _bind(host, port, self.reuse_port),
                backlog=511,
                shutdown_timeout=self.config.spec.shutdown_timeout_ms / 1000,
            )
            await site.start()
        for host, port in self.bound_addresses:
            log.log(errorlog.NOTICE, "listening on %s:%s", host, port)
        # What start-up built (modules, the compiled configuration) lives as long as the
        # process: keep it out of the cyclic collector, whose first full pass over it would
        # otherwise stall the serving loop for tens of milliseconds.
        gc.freeze()

    async def _start_admin(self) -> None:
        assert self.bans is not None and self.config.spec.admin.listen is not None
        self.admin = await serve_admin(
            self.config.spec,
            self.bans,
            self.reload,
            self.status,
            config=lambda: self.config.spec,
            serving=lambda: bool(self.bound_addresses) and not self._stopping,
        )

    def status(self) -> dict[str, Any]:
        return node_status(self.config, self.store, self.banlist, self.bans)

    @property
    def bound_addresses(self) -> list[tuple[str, int]]:
        if self.runner is None:
            return []
        return [(a[0], a[1]) for a in self.runner.addresses]

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        loop.add_signal_handler(signal.SIGINT, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: spawn(self.reload()))
        loop.add_signal_handler(signal.SIGUSR1, self.reopen_logs)

    def request_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        log.log(
            errorlog.NOTICE,
            "shutting down gracefully (up to %ss for requests in flight)",
            self.config.spec.shutdown_timeout_ms / 1000,
        )
        spawn(self.stop())

    async def stop(self) -> None:
        try:
            if self.runner is not None:
                await self.runner.cleanup()
            if self.admin is not None:
                await self.admin.close()
            if self.bans is not None:
                await self.bans.close()
            if self._expiry is not None:
                self._expiry.cancel()
            await self.upstreams.close()
            await self.store.close()
        finally:
            self.sink.close()
            self.stopped.set()

    # -- reload ------------------------------------------------------------------------------
    async def reload(self) -> list[str]:
        """Load the config file again; returns the errors (empty on success).

        Parsing and compiling run in a worker thread; only the swap (``apply``) runs on the loop.
        """
        try:
            fresh = await load_config_off_loop(self.config_path, self.overrides)
        except ConfigErrors as exc:
            for err in exc.errors:
                log.error("reload failed, keeping the running configuration: %s", err)
            return [str(e) for e in exc.errors]
        replaced: list[object] = [self.config]
        errors = self.apply(fresh)
        if not errors:
            log.log(errorlog.NOTICE, "configuration reloaded from %s", self.config_path)
        del fresh
        spawn(release_off_loop(replaced))  # freeing 2000 routes at once would hold the GIL for ms
        return errors

    def apply(self, fresh: CompiledConfig) -> list[str]:
        old = self.config.spec
        new = fresh.spec
        errors: list[str] = []
        if new.listen != old.listen or new.workers != old.workers:
            log.warning("listen and workers changes take effect on restart, not on reload")
        if self.edge is not None:
            self.edge.configure(edge_settings(new))
            set_server_tokens(new.edge.server_tokens)
        retired = self.upstreams.update(dict(new.upstreams))
        self.store.configure(new.zones)
        if new.log != old.log:
            errorlog.configure(new.log.error, new.log.level)
            if new.log.access != old.log.access:
                self.sink.close()
                self.sink = LogSink(new.log.access)
            self.access_log = AccessLog(new.log.format, self.sink)
            self.pipeline.access_log = self.access_log
        self.config = fresh
        self.pipeline.config = fresh
        if retired:
            spawn(_close_later(retired))
        return errors

    def reopen_logs(self) -> None:
        self.sink.reopen()
        errorlog.configure(self.config.spec.log.error, self.config.spec.log.level)


async def _close_later(pools: list[UpstreamPool]) -> None:
    """A reload retired these pools: close them once nothing uses them (long downloads and
    WebSockets included); their idle keep-alive connections go at once."""
    for pool in pools:
        pool.connections.close()
    while any(pool.in_flight for pool in pools):
        await asyncio.sleep(1.0)
    for pool in pools:
        await pool.close()


def node_status(
    config: CompiledConfig, store: Any, banlist: BanList, bans: LocalBans | RedisBans | None = None
) -> dict[str, Any]:
    """What /status reports about this node's limits."""
    status: dict[str, Any] = {
        "store": getattr(store, "kind", "redis"),
        "routes": len(config.routes),
        "bans": len(banlist),
    }
    if bans is not None:
        status["ban_list"] = bans.status()  # count, and when it was last known current
    breaker = getattr(store, "breaker", None)
    if breaker is not None:
        status["redis_circuit"] = "open" if breaker.open else "closed"
    zones = getattr(store, "zones", None)
    if isinstance(store, MemoryStore) and zones:
        status["zones"] = {
            name: {"type": zone.kind, "keys": len(zone), "bytes": zone.used, "size": zone.size}
            for name, zone in zones.items()
        }
    return status


def _bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(511)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
