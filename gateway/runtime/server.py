"""One serving process: listeners, the pipeline, reload and graceful shutdown.

Lifecycle:

* start: compile the config, open upstream pools, bind every ``listen`` address
  (with SO_REUSEPORT when several workers share a port);
* SIGHUP (or ``reload()``): load the file again; on any error, log every problem
  and keep serving the old configuration; bind the addresses a new ``listen``
  adds (a failure is an error too: nothing changes); on success swap the plan in
  one assignment, keeping unchanged upstream pools (and their idle connections),
  then accept on the new listeners and stop the removed ones (``listeners.py``:
  requests in flight there finish, keep-alive connections close after theirs).
  A ``workers`` change needs the master (``supervisor.py``): a gateway started
  with one worker runs without one, so the reload says it needs a restart, as it does
  for every other setting only a restart applies (``restart.py``);
* SIGTERM / SIGINT: stop accepting, close idle keep-alive connections, let
  in-flight requests finish up to ``shutdown_timeout``, then cancel the rest;
* SIGUSR1: reopen log files, like ``nginx -s reopen``.

Under systemd (``Type=notify``) the single serving process reports a reload and a drain
(``notify.py``); the command that starts it reports readiness once it listens.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
from typing import Any

from aiohttp import web

from gateway.admin.api import ReloadReply
from gateway.background import spawn
from gateway.bans.local import BanList, WorkerBans, run_expiry
from gateway.clock import monotonic_ms
from gateway.config.overrides import Overrides
from gateway.config.servers import ListenSpec
from gateway.edge import EdgeServer, edge_settings, set_server_tokens
from gateway.edge.proxyproto import ProxyProtocolSite
from gateway.edge.tls import TlsListener, TlsSite
from gateway.errors import ConfigErrors
from gateway.logs import error as errorlog
from gateway.logs.access import AccessLog, LogSink, aiohttp_logger_class
from gateway.metrics import MetricsHub, channel
from gateway.metrics.activity import Activity, ConfigInfo, process_snapshot, retire_snapshot, worker_snapshots
from gateway.metrics.channel import STATS_ENV, StatsClient
from gateway.metrics.sources import register_gauges
from gateway.metrics.stats import STATS
from gateway.pipeline import Pipeline
from gateway.pipeline.limiting import Limiter
from gateway.plan.compiled import CompiledConfig
from gateway.proxy.headers import set_underscores_in_headers
from gateway.proxy.upstream import UpstreamPool, Upstreams
from gateway.runtime import notify
from gateway.runtime.listeners import BACKLOG, BindFailed, Listeners, describe
from gateway.runtime.node import Node, node_status
from gateway.runtime.offloop import load_config_off_loop, release_off_loop
from gateway.runtime.restart import restart_notes
from gateway.store import make_store

log = errorlog.log
BAN_LIST_WAIT_S = 30.0  # a worker waits this long for its master's ban list before it listens
GC_YOUNG_THRESHOLD = 2000  # allocations between two passes of the youngest generation (Python's: 700)


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
        self.activity = Activity()  # what the status page shows (per process)
        self.access_log = AccessLog(config.spec.log.format, self.sink, self.activity.response)
        self.store = make_store(config.spec)
        self.store.configure(config.spec.zones)
        self.banlist = BanList()
        self.node: Node | None = None  # the bans, and the admin API and metrics listener it serves
        self.serves_admin = not reuse_port  # with several workers, the master serves it
        self.config_info = ConfigInfo(config_path)
        limiter = Limiter(self.store, self.activity)
        self.pipeline = Pipeline(config, self.upstreams, self.access_log, limiter, self.banlist)
        self.runner: web.ServerRunner | None = None
        self.edge: EdgeServer | None = None
        self.listeners: Listeners | None = None
        self.stopped = asyncio.Event()
        self._expiry: asyncio.Task[Any] | None = None  # a worker's own sweep of ended bans
        self._stopping = False
        self.tls_listeners: dict[tuple[str, int], TlsListener] = {}  # by address, for reloads
        # /metrics: this process's (one worker), or sent to the master (``workers: N``)
        self.metrics = MetricsHub(self.config_info)
        stats_path = os.environ.get(STATS_ENV) if reuse_port else None
        self.stats_client = StatsClient(stats_path) if stats_path else None
        if self.stats_client is not None:  # the status page's counts go to the master the same way
            channel.register("status", self.snapshot, worker_snapshots, retire_snapshot)
        edge = lambda: self.edge.limiter if self.edge is not None else None
        register_gauges(STATS, edge, self.banlist, self.store, self.upstreams)

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        await self.store.start()
        worker_bans = WorkerBans(self.banlist)
        if self.store.deliver_bans(worker_bans.apply):  # a worker: the master pushes bans
            self._expiry = spawn(run_expiry(self.banlist))
            # The whole list before the first request (the master sends it on connect).
            try:
                async with asyncio.timeout(BAN_LIST_WAIT_S):
                    await worker_bans.complete.wait()
            except TimeoutError:
                log.error("the master did not send the ban list within %ss; serving meanwhile", BAN_LIST_WAIT_S)
        self.node = Node(self.config.spec, self.store, self.banlist, follow=True)
        await self.node.start(self, self.metrics, serve=self.serves_admin)
        if self.stats_client is not None:
            await self.stats_client.start()
        self.upstreams.update(dict(self.config.spec.upstreams))
        set_server_tokens(self.config.spec.edge.server_tokens)
        set_underscores_in_headers(self.config.spec.edge.underscores_in_headers)
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
        self.listeners = Listeners(self.edge, self.reuse_port, self._make_site)
        try:
            fresh = self.listeners.prepare(self.config.spec.listen)
        except BindFailed as exc:
            raise OSError(str(exc)) from None
        await self.listeners.commit(self.config.spec.listen, fresh)
        for host, port in self.bound_addresses:
            log.log(errorlog.NOTICE, "listening on %s:%s", host, port)
        # What start-up built (modules, the compiled configuration) lives as long as the
        # process: keep it out of the cyclic collector, whose first full pass over it would
        # otherwise stall the serving loop for tens of milliseconds.
        gc.freeze()
        # No request leaves a reference cycle (tests/test_metrics.py checks it), so a
        # young-generation pass finds only the objects of the requests in flight, and frees
        # nothing. At Python's 700, 50 busy connections start one every ~60 requests (~3 us
        # per request); at 2,000, one every ~2,000 requests.
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])

    def _make_site(self, entry: ListenSpec, sock: socket.socket) -> web.SockSite:
        """The site serving one bound ``listen`` entry: TLS when the entry has ``ssl``, with the
        certificates of the configuration in force (a reload commits new sites after ``apply``)."""
        assert self.runner is not None
        shutdown_s = self.config.spec.shutdown_timeout_ms / 1000
        if not entry.ssl:
            site = ProxyProtocolSite if entry.proxy_protocol else web.SockSite
            return site(self.runner, sock, backlog=BACKLOG, shutdown_timeout=shutdown_s)
        table = self.config.tls.get(entry.address)
        if table is None:
            sock.close()
            raise OSError(f"no certificate for {entry}")
        listener = self.tls_listeners[entry.address] = TlsListener(table)
        return TlsSite(
            self.runner,
            sock,
            listener,
            proxy_protocol=entry.proxy_protocol,
            backlog=BACKLOG,
            shutdown_timeout=shutdown_s,
        )

    def status(self) -> dict[str, Any]:
        return node_status(self.config, self.store, self.banlist, self.node.bans if self.node is not None else None)

    def serving(self) -> bool:
        """Listening and not shutting down (``/readyz``)."""
        return bool(self.bound_addresses) and not self._stopping

    def snapshot(self) -> dict[str, Any]:
        """This process's part of ``GET /status/activity`` (a worker's answer to its master)."""
        return process_snapshot(self.activity, self.upstreams.pools, self.store, monotonic_ms())

    async def activity_status(self) -> dict[str, Any]:
        body = self.snapshot()
        body["config"] = self.config_info.view()
        return body

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
        notify.stopping()
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
            if self.stats_client is not None:  # after the last request: its counts go to the master
                await self.stats_client.close()
            if self.node is not None:  # the metrics listener, the admin API, the bans
                await self.node.close()
            if self._expiry is not None:
                self._expiry.cancel()
            await self.upstreams.close()
            await self.store.close()
        finally:
            self.sink.close()
            self.stopped.set()

    # -- reload ------------------------------------------------------------------------------
    async def reload(self) -> ReloadReply:
        """Load the config file again; returns (errors, notes): no errors means it is in force.

        systemd hears RELOADING=1 first and READY=1 once it is over, whatever its outcome (a
        failed reload keeps serving the running configuration).
        """
        notify.reloading()
        errors: list[str] = ["reload did not finish"]
        try:
            errors, notes = await self._reload()
            return errors, notes
        finally:
            if not self._stopping:
                notify.ready(reload_status(errors))

    async def _reload(self) -> ReloadReply:
        """The reload itself.

        Parsing and compiling run in a worker thread; new listeners are bound before anything
        changes (a bind failure keeps the running configuration); the swap (``apply``) runs on
        the loop.
        """
        try:
            fresh = await load_config_off_loop(self.config_path, self.overrides)
        except ConfigErrors as exc:
            for err in exc.errors:
                log.error("reload failed, keeping the running configuration: %s", err)
            await asyncio.to_thread(self.config_info.reloaded, False)  # reads the file: off the loop
            return [str(e) for e in exc.errors], []
        notes: list[str] = []
        if not self.reuse_port:  # a worker's master answers the reload, with its own notes
            notes = restart_notes(self.config.spec, fresh.spec, single_process=True)
        for note in notes:
            log.warning("%s", note)
        bound: dict[object, object] = {}
        if self.listeners is not None and fresh.spec.listen != self.listeners.entries:
            try:
                bound = dict(self.listeners.prepare(fresh.spec.listen))
            except BindFailed as exc:
                error = f"reload failed, keeping the running configuration and listeners: {exc}"
                log.error("%s", error)
                await asyncio.to_thread(self.config_info.reloaded, False)
                return [error], notes
        replaced: list[object] = [self.config]
        self.apply(fresh)
        if self.listeners is not None and (bound or fresh.spec.listen != self.listeners.entries):
            added, removed = await self.listeners.commit(fresh.spec.listen, bound)  # type: ignore[arg-type]
            for entry in added:
                log.log(errorlog.NOTICE, "listening on %s", describe(entry))
            for entry in removed:
                log.log(errorlog.NOTICE, "stopped listening on %s", describe(entry))
                if entry.ssl:
                    self.tls_listeners.pop(entry.address, None)
        log.log(errorlog.NOTICE, "configuration reloaded from %s", self.config_path)
        del fresh
        spawn(release_off_loop(replaced))  # freeing 2000 routes at once would hold the GIL for ms
        await asyncio.to_thread(self.config_info.reloaded, True)  # reads the file: off the loop
        return [], notes

    def apply(self, fresh: CompiledConfig) -> None:
        old = self.config.spec
        new = fresh.spec
        if self.edge is not None:
            self.edge.configure(edge_settings(new))
            set_server_tokens(new.edge.server_tokens)
            set_underscores_in_headers(new.edge.underscores_in_headers)
        for address, listener in self.tls_listeners.items():
            table = fresh.tls.get(address)
            if table is not None:  # new certificates for the next handshakes; live connections keep theirs
                listener.update(table)
        retired = self.upstreams.update(dict(new.upstreams))
        self.store.configure(new.zones)
        if new.log != old.log:
            errorlog.configure(new.log.error, new.log.level)
            if new.log.access != old.log.access:
                self.sink.close()
                self.sink = LogSink(new.log.access)
            self.access_log = AccessLog(new.log.format, self.sink, self.activity.response)
            self.pipeline.access_log = self.access_log
        self.config = fresh
        self.pipeline.config = fresh
        if retired:
            spawn(_close_later(retired))

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


def reload_status(errors: list[str]) -> str:
    """systemd's STATUS= after a reload (``systemctl status`` shows it)."""
    if errors:
        return "reload failed, running the previous configuration: see the error log"
    return "serving; configuration reloaded"
