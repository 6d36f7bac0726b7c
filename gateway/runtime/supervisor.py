"""The master process for ``workers: N``, like nginx's master.

It starts N worker processes (each a fresh interpreter running ``gateway run
--worker``) that bind the same ports with SO_REUSEPORT, so the kernel spreads
connections across them. With the embedded store it also owns the node's limit
state and serves it to the workers over a Unix socket (``store/shared.py``), so
limits count the whole node, as nginx's shared-memory zones do. In both store
modes it asks the workers for their metrics when it is scraped
(``metrics/channel.py``). It forwards signals:

* SIGHUP: validate the file first, and bind-check the addresses a new ``listen``
  adds; on success every worker reloads (and rebinds its listeners), surplus
  workers of a smaller ``workers`` retire gracefully (SIGTERM: they drain, as
  nginx's old workers do) and a larger one starts new workers; on failure the
  errors are logged and nothing changes;
* SIGTERM / SIGINT: graceful stop of every worker, then exit;
* SIGUSR1: workers reopen their logs.

A worker that dies is restarted ("worker process 1234 exited with code 1").

Under systemd (``Type=notify``) the master alone speaks to it (``notify.py``): READY=1 once
every worker is started, RELOADING=1 ... READY=1 around a reload, STOPPING=1 at the stop.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gateway.admin.api import ReloadReply
from gateway.background import spawn
from gateway.bans.local import BanList, LocalBans
from gateway.config.overrides import Overrides
from gateway.errors import BanStoreError, ConfigErrors
from gateway.logs import error as errorlog
from gateway.metrics import MetricsHub, channel
from gateway.metrics.activity import ConfigInfo, merge, retire_snapshot, worker_snapshots
from gateway.metrics.channel import STATS_ENV, StatsServer
from gateway.plan.compiled import CompiledConfig
from gateway.runtime import notify
from gateway.runtime.listeners import BindFailed, check_bindable
from gateway.runtime.node import Node, node_status
from gateway.runtime.offloop import load_config_off_loop, release_off_loop
from gateway.runtime.restart import restart_notes
from gateway.runtime.server import reload_status
from gateway.store import SOCKET_ENV
from gateway.store.memory import MemoryStore
from gateway.store.shared import SharedStoreServer

log = errorlog.log


class Supervisor:
    def __init__(
        self,
        config_path: str,
        config: CompiledConfig,
        worker_args: Sequence[str],
        count: int,
        overrides: Overrides,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.config_path = config_path
        self.config = config
        self.worker_args = list(worker_args)
        self.count = count
        self.overrides = overrides
        self.extra_env = extra_env or {}
        self.workers: dict[int, asyncio.subprocess.Process] = {}
        self.retiring: set[asyncio.subprocess.Process] = set()  # SIGTERMed by a reload; not restarted
        self.store: MemoryStore | None = None
        self.banlist = BanList()
        self.node: Node | None = None  # the bans, the admin API and the metrics listener
        self._tmpdir = ""
        self.metrics: MetricsHub | None = None
        self.stopping = False
        self.done = asyncio.Event()
        self.config_info = ConfigInfo(config_path)
        # The status page's data lives in the workers: an async callable answering each worker's
        # ``GatewayServer.snapshot()`` (over the stats channel, set in ``run``).
        self.collect_snapshots: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None

    async def run(self) -> int:
        shared = None
        spec = self.config.spec
        node = self.node = Node(spec, None, self.banlist, follow=False)
        self._tmpdir = tempfile.mkdtemp(prefix="gateway-")
        # The workers' stats (for /metrics), in both store modes.
        stats = StatsServer(os.path.join(self._tmpdir, "stats.sock"))
        await stats.start()
        self.extra_env[STATS_ENV] = stats.path
        self.metrics = MetricsHub(self.config_info, workers=stats)
        # The status page's counts live in the workers: they come over the same channel.
        channel.register("status", dict, worker_snapshots, retire_snapshot)
        self.collect_snapshots = lambda: _status_snapshots(stats)
        if spec.store.redis is None:
            # One embedded store for the whole node, served to the workers.
            path = os.path.join(self._tmpdir, "store.sock")
            self.store = MemoryStore()
            self.store.configure(spec.zones)
            shared = SharedStoreServer(self.store, path)
            await shared.start()
            self.extra_env[SOCKET_ENV] = path
            if isinstance(node.bans, LocalBans):
                node.bans.listeners.append(shared.push_bans)
        try:
            await node.start(self, self.metrics)  # the bans in force are loaded before any worker starts
        except BanStoreError as exc:
            log.critical("%s", exc)
            failed = True
        else:
            failed = False
        try:
            return 1 if failed else await self._run()
        finally:
            await node.close()  # the metrics listener, the admin API, the bans
            if shared is not None:
                await shared.close()
            await stats.close()
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def status(self) -> dict[str, Any]:
        status = node_status(self.config, self.store, self.banlist, self.node.bans if self.node is not None else None)
        status["workers"] = sorted(proc.pid for proc in self.workers.values())
        if self.config.spec.store.redis is not None:
            status["store"] = "redis"
        return status

    def serving(self) -> bool:
        """Workers are running and the master is not stopping (``/readyz``)."""
        return bool(self.workers) and not self.stopping

    async def activity_status(self) -> dict[str, Any]:
        """``GET /status/activity`` for the node: the workers' snapshots merged, plus the config."""
        snapshots = await self.collect_snapshots() if self.collect_snapshots is not None else []
        body = merge(snapshots)
        body["workers"] = {"running": len(self.workers), "reported": len(snapshots)}
        body["config"] = self.config_info.view()
        return body

    async def _run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop)
        loop.add_signal_handler(signal.SIGINT, self._stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: spawn(self.reload()))
        loop.add_signal_handler(signal.SIGUSR1, lambda: self._signal_all(signal.SIGUSR1))
        for index in range(self.count):
            await self._spawn(index)
        if not self.stopping:
            notify.ready(f"serving with {self.count} workers")
        await self.done.wait()
        return 0

    async def _spawn(self, index: int) -> None:
        env = notify.child_environment(dict(os.environ))
        env.update(self.extra_env)
        env["GATEWAY_WORKER_INDEX"] = str(index)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "run", "-c", self.config_path, "--worker", *self.worker_args, env=env
        )
        if self.stopping:  # a stop arrived while it was starting
            proc.terminate()
            await proc.wait()
            return
        self.workers[index] = proc
        log.log(errorlog.NOTICE, "start worker process %d", proc.pid)
        spawn(self._watch(index, proc))

    async def _watch(self, index: int, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if self.workers.get(index) is proc:
            del self.workers[index]
        if proc in self.retiring:
            self.retiring.discard(proc)
            log.log(errorlog.NOTICE, "worker process %d retired (exit code %s)", proc.pid, code)
            if self.stopping and not self.workers:
                self.done.set()
            return
        if self.stopping:
            if not self.workers:
                self.done.set()
            return
        how = f"on signal {-code}" if code < 0 else f"with code {code}"
        log.error("worker process %d exited %s; starting a new one", proc.pid, how)
        await asyncio.sleep(0.5)
        if not self.stopping and index < self.count and index not in self.workers:
            await self._spawn(index)

    def _signal_all(self, signum: int, *, retiring: bool = True) -> None:
        """Signal every worker; ``retiring=False`` leaves out those draining after a resize."""
        for proc in [*self.workers.values(), *(self.retiring if retiring else ())]:
            if proc.returncode is None:
                proc.send_signal(signum)

    def _stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        notify.stopping()
        log.log(errorlog.NOTICE, "stopping %d worker processes", len(self.workers))
        self._signal_all(signal.SIGTERM)
        if not self.workers and not self.retiring:
            self.done.set()
            return
        grace = self.config.spec.shutdown_timeout_ms / 1000 + 5
        asyncio.get_running_loop().call_later(grace, self._kill_all)

    def _kill_all(self) -> None:
        if self.workers or self.retiring:
            log.warning("workers still running after the shutdown timeout; killing them")
            self._signal_all(signal.SIGKILL)

    async def reload(self) -> ReloadReply:
        """Reload the node (``_reload``), between RELOADING=1 and READY=1 for systemd."""
        notify.reloading()
        errors: list[str] = ["reload did not finish"]
        try:
            errors, notes = await self._reload()
            return errors, notes
        finally:
            if not self.stopping:
                notify.ready(reload_status(errors))

    async def _reload(self) -> ReloadReply:
        try:  # parsed in a worker thread: the loop keeps serving the workers' limit state
            fresh = await load_config_off_loop(self.config_path, self.overrides)
        except ConfigErrors as exc:
            for err in exc.errors:
                log.error("reload failed, keeping the running configuration: %s", err)
            await asyncio.to_thread(self.config_info.reloaded, False)  # reads the file: off the loop
            return [str(e) for e in exc.errors], []
        added = [entry for entry in fresh.spec.listen if entry not in self.config.spec.listen]
        try:  # before any worker changes: a port another process holds fails the whole reload
            check_bindable(added)
        except BindFailed as exc:
            error = f"reload failed, keeping the running configuration and listeners: {exc}"
            log.error("%s", error)
            await asyncio.to_thread(self.config_info.reloaded, False)
            return [error], []
        notes = restart_notes(self.config.spec, fresh.spec, single_process=False)
        for note in notes:
            log.warning("%s", note)
        replaced: list[object] = [self.config]
        self.config = fresh
        del fresh
        if self.store is not None:
            self.store.configure(self.config.spec.zones)
        log.log(errorlog.NOTICE, "reconfiguring: signalling %d workers", len(self.workers))
        self._signal_all(signal.SIGHUP, retiring=False)
        await self._resize(self.config.spec.workers or (os.cpu_count() or 1))
        spawn(release_off_loop(replaced))
        await asyncio.to_thread(self.config_info.reloaded, True)
        return [], notes

    async def _resize(self, count: int) -> None:
        """Start workers up to ``count``, or retire the surplus gracefully (they drain, then exit)."""
        if count == self.count or self.stopping:
            return
        log.log(errorlog.NOTICE, "workers: %d -> %d", self.count, count)
        previous, self.count = self.count, count
        for index in sorted(self.workers):
            if index >= count:
                proc = self.workers.pop(index)
                self.retiring.add(proc)
                log.log(errorlog.NOTICE, "retiring worker process %d (graceful)", proc.pid)
                proc.send_signal(signal.SIGTERM)
        for index in range(previous, count):
            if index not in self.workers:
                await self._spawn(index)


async def _status_snapshots(stats: StatsServer) -> list[dict[str, Any]]:
    collected = await stats.collect()
    return worker_snapshots([collected.get("status", [])])
