"""Manual bans: an IP or CIDR, until a time, with a reason; enforced on every route.

Every serving process keeps a ``BanList`` (``gateway/bans/table.py``); the request path
only ever reads that local copy, and every change to it is O(1). Where the bans are kept:

* with ``store.redis``: ``RedisBans`` (``gateway/bans/redis.py``), a hash shared by all
  nodes plus a version counter, a change log and an expiry index; nodes follow the
  changes through pub/sub and read only what changed;
* with the embedded store: ``LocalBans``, in the process that serves the admin API (the
  only process, or the master of several workers, which pushes each change to them). With
  a ``BanDatabase`` (``database.py``: SQLite in ``state_dir``) every change is committed
  there before the table changes and the call returns, and ``start`` loads the bans in
  force (the ended ones are deleted), so a restart, even a ``kill -9``, loses none.

Both offer the same calls: ``add_many``, ``remove_many``, ``select``, ``status``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from gateway.background import spawn
from gateway.bans.database import BanDatabase
from gateway.bans.redis import RedisBans
from gateway.bans.table import Ban, BanList, canonical_target, run_expiry
from gateway.clock import epoch_ms
from gateway.logs import error as errorlog

__all__ = [
    "Ban",
    "BanList",
    "LocalBans",
    "RedisBans",
    "canonical_target",
    "run_expiry",
]

PURGE_EVERY_S = 60.0  # how often ended bans are deleted from the database
Listener = Callable[[Sequence[Ban], Sequence[str]], None]  # (added or replaced, removed targets)


class LocalBans:
    """Bans kept in this process (embedded store); ``listeners`` hear every change."""

    def __init__(self, banlist: BanList, database: BanDatabase | None = None) -> None:
        self.banlist = banlist
        self.database = database
        self.listeners: list[Listener] = []
        self.last_change_ms = 0
        self.loaded = 0  # bans read from the database at start
        self._expiry: asyncio.Task[Any] | None = None
        self._write_lock = asyncio.Lock()  # changes reach the database in the order they are made

    async def add(self, ban: Ban) -> None:
        await self.add_many([ban])

    async def remove(self, target: str) -> bool:
        return bool(await self.remove_many([target]))

    async def add_many(self, bans: Sequence[Ban]) -> None:
        # Shielded: a caller that gives up (the admin API's deadline) must not leave a change
        # committed to the database but not in force; it completes either way.
        await asyncio.shield(self._add_many(bans))

    async def _add_many(self, bans: Sequence[Ban]) -> None:
        async with self._write_lock:
            if self.database is not None:  # committed, in one transaction, before anything is in force
                await asyncio.to_thread(self.database.put_many, bans)
            await self._apply_adds(bans)

    async def _apply_adds(self, bans: Sequence[Ban]) -> None:
        for i in range(0, len(bans), 2000):
            chunk = bans[i : i + 2000]
            for ban in chunk:
                self.banlist.put(ban)
            self._notify(chunk, ())
            await asyncio.sleep(0)  # a 100k import never holds the loop for long

    async def remove_many(self, targets: Sequence[str]) -> list[str]:
        return await asyncio.shield(self._remove_many(targets))

    async def _remove_many(self, targets: Sequence[str]) -> list[str]:
        async with self._write_lock:
            if self.database is not None:
                await asyncio.to_thread(self.database.remove_many, targets)
            return await self._apply_removes(targets)

    async def _apply_removes(self, targets: Sequence[str]) -> list[str]:
        found: list[str] = []
        for i in range(0, len(targets), 2000):
            chunk = [t for t in targets[i : i + 2000] if self.banlist.remove(t)]
            self._notify((), chunk)
            found += chunk
            await asyncio.sleep(0)
        return found

    async def select(
        self, *, within: str | None = None, reason: str | None = None, offset: int = 0, limit: int = 0
    ) -> tuple[int, list[Ban]]:
        return await self.banlist.select(epoch_ms(), within=within, reason=reason, offset=offset, limit=limit)

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"count": len(self.banlist), "source": "local", "last_change_ms": self.last_change_ms}
        if self.database is not None:
            status["database"] = self.database.path
        return status

    def _notify(self, added: Sequence[Ban], removed: Sequence[str]) -> None:
        self.last_change_ms = epoch_ms()
        if not added and not removed:
            return
        for listener in self.listeners:
            listener(added, removed)

    async def start(self) -> None:
        """Load the bans in force from the database (before the node serves), then sweep ended ones."""
        if self.database is not None:
            await asyncio.to_thread(self.database.open)
            bans = await asyncio.to_thread(self.database.load, epoch_ms())
            await self._apply_adds(bans)
            self.loaded = len(bans)
        self._expiry = spawn(self._run_expiry())

    async def _run_expiry(self) -> None:
        """Ended bans leave the table every second, and the database every ``PURGE_EVERY_S``
        (a restart deletes them too: the database only ever answers for bans in force)."""
        table = spawn(run_expiry(self.banlist))
        try:
            while self.database is not None:
                await asyncio.sleep(PURGE_EVERY_S)
                try:
                    async with self._write_lock:
                        await asyncio.to_thread(self.database.purge, epoch_ms())
                except Exception as exc:  # e.g. a full disk: the table still drops them; try again later
                    errorlog.log.error("%s", exc)
            await table
        finally:
            table.cancel()

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        if self.database is not None:
            async with self._write_lock:
                await asyncio.to_thread(self.database.close)


class WorkerBans:
    """A worker's copy, fed by the master (``SharedStoreClient.on_bans``): changes, or the whole list on connect."""

    def __init__(self, banlist: BanList) -> None:
        self.banlist = banlist
        self._snapshot: set[str] | None = None  # targets of the list being received
        self.complete = asyncio.Event()  # the whole list has arrived once: the worker may serve

    def apply(self, added: Sequence[Ban], removed: Sequence[str], part: int) -> None:
        if part == 1 and self._snapshot is None:
            self._snapshot = set()
        for ban in added:
            self.banlist.put(ban)
            if part == 1 and self._snapshot is not None:
                self._snapshot.add(ban.target)
        for target in removed:
            self.banlist.remove(target)
        if part == 2:
            kept = self._snapshot or set()
            for target in [t for t in self.banlist.bans if t not in kept]:
                self.banlist.remove(target)
            self._snapshot = None
            self.complete.set()
