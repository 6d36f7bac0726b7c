"""The master process for ``workers: N``, like nginx's master.

It starts N worker processes (each a fresh interpreter running ``gateway run
--worker``) that bind the same ports with SO_REUSEPORT, so the kernel spreads
connections across them. With the embedded store it also owns the node's limit
state and serves it to the workers over a Unix socket (``store/shared.py``), so
limits count the whole node, as nginx's shared-memory zones do. It forwards
signals:

* SIGHUP: validate the file first; on success every worker reloads, on failure
  the errors are logged and nothing changes;
* SIGTERM / SIGINT: graceful stop of every worker, then exit;
* SIGUSR1: workers reopen their logs.

A worker that dies is restarted ("worker process 1234 exited with code 1").
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from gateway import errorlog
from gateway.admin import serve_admin
from gateway.background import spawn
from gateway.bans import BanList, LocalBans, RedisBans
from gateway.config.offloop import load_config_off_loop, release_off_loop
from gateway.errors import ConfigErrors
from gateway.overrides import Overrides
from gateway.plan import CompiledConfig
from gateway.server import node_status
from gateway.store import SOCKET_ENV, open_bans
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
        self.store: MemoryStore | None = None
        self.banlist = BanList()
        self._bans: LocalBans | RedisBans | None = None
        self._tmpdir = ""
        self.stopping = False
        self.done = asyncio.Event()

    async def run(self) -> int:
        shared = None
        spec = self.config.spec
        bans = self._bans = open_bans(spec, None, self.banlist, follow=False)
        if spec.store.redis is None:
            # One embedded store for the whole node, served to the workers.
            self._tmpdir = tempfile.mkdtemp(prefix="gateway-")
            path = os.path.join(self._tmpdir, "store.sock")
            self.store = MemoryStore()
            self.store.configure(spec.zones)
            shared = SharedStoreServer(self.store, path)
            await shared.start()
            self.extra_env[SOCKET_ENV] = path
            if isinstance(bans, LocalBans):
                bans.listeners.append(shared.push_bans)
        if bans is not None:
            await bans.start()
        admin = None
        if bans is not None and spec.admin.listen is not None:
            admin = await serve_admin(
                spec,
                bans,
                self.reload,
                self.status,
                config=lambda: self.config.spec,
                serving=lambda: bool(self.workers) and not self.stopping,
            )
        try:
            return await self._run()
        finally:
            if admin is not None:
                await admin.close()
            if bans is not None:
                await bans.close()
            if shared is not None:
                await shared.close()
                shutil.rmtree(self._tmpdir, ignore_errors=True)

    def status(self) -> dict[str, Any]:
        status = node_status(self.config, self.store, self.banlist, self._bans)
        status["workers"] = sorted(proc.pid for proc in self.workers.values())
        if self.config.spec.store.redis is not None:
            status["store"] = "redis"
        return status

    async def _run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop)
        loop.add_signal_handler(signal.SIGINT, self._stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: spawn(self.reload()))
        loop.add_signal_handler(signal.SIGUSR1, lambda: self._signal_all(signal.SIGUSR1))
        for index in range(self.count):
            await self._spawn(index)
        await self.done.wait()
        return 0

    async def _spawn(self, index: int) -> None:
        env = dict(os.environ)
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
        if self.stopping:
            if not self.workers:
                self.done.set()
            return
        how = f"on signal {-code}" if code < 0 else f"with code {code}"
        log.error("worker process %d exited %s; starting a new one", proc.pid, how)
        await asyncio.sleep(0.5)
        if not self.stopping:
            await self._spawn(index)

    def _signal_all(self, signum: int) -> None:
        for proc in self.workers.values():
            if proc.returncode is None:
                proc.send_signal(signum)

    def _stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        log.log(errorlog.NOTICE, "stopping %d worker processes", len(self.workers))
        self._signal_all(signal.SIGTERM)
        if not self.workers:
            self.done.set()
            return
        grace = self.config.spec.shutdown_timeout_ms / 1000 + 5
        asyncio.get_running_loop().call_later(grace, self._kill_all)

    def _kill_all(self) -> None:
        if self.workers:
            log.warning("workers still running after the shutdown timeout; killing them")
            self._signal_all(signal.SIGKILL)

    async def reload(self) -> list[str]:
        try:  # parsed in a worker thread: the loop keeps serving the workers' limit state
            fresh = await load_config_off_loop(self.config_path, self.overrides)
        except ConfigErrors as exc:
            for err in exc.errors:
                log.error("reload failed, keeping the running configuration: %s", err)
            return [str(e) for e in exc.errors]
        replaced: list[object] = [self.config]
        self.config = fresh
        del fresh
        if self.store is not None:
            self.store.configure(self.config.spec.zones)
        log.log(errorlog.NOTICE, "reconfiguring: signalling %d workers", len(self.workers))
        self._signal_all(signal.SIGHUP)
        spawn(release_off_loop(replaced))
        return []
