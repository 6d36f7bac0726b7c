"""Manual bans: an IP or CIDR, until a time, with a reason; enforced on every route.

Every serving process keeps a ``BanList`` (``gateway/bans/table.py``); the request path
only ever reads that local copy, and every change to it is O(1). Where the bans are kept:

* with ``store.redis``: ``RedisBans`` (``gateway/bans/redis.py``), a hash shared by all
  nodes plus a version counter, a change log and an expiry index; nodes follow the
  changes through pub/sub and read only what changed;
* with the embedded store: ``LocalBans``, in the process that serves the admin API (the
  only process, or the master of several workers, which pushes each change to them).

Both offer the same calls: ``add_many``, ``remove_many``, ``select``, ``status``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from gateway.background import spawn
from gateway.bans.redis import RedisBans
from gateway.bans.table import Ban, BanList, canonical_target, run_expiry
from gateway.clock import epoch_ms

__all__ = [
    "Ban",
    "BanList",
    "LocalBans",
    "RedisBans",
    "canonical_target",
    "run_expiry",
]

Listener = Callable[[Sequence[Ban], Sequence[str]], None]  # (added or replaced, removed targets)


class LocalBans:
    """Bans kept in this process (embedded store); ``listeners`` hear every change."""

    def __init__(self, banlist: BanList) -> None:
        self.banlist = banlist
        self.listeners: list[Listener] = []
        self.last_change_ms = 0
        self._expiry: asyncio.Task[Any] | None = None

    async def add(self, ban: Ban) -> None:
        await self.add_many([ban])

    async def remove(self, target: str) -> bool:
        return bool(await self.remove_many([target]))

    async def add_many(self, bans: Sequence[Ban]) -> None:
        for i in range(0, len(bans), 2000):
            chunk = bans[i : i + 2000]
            for ban in chunk:
                self.banlist.put(ban)
            self._notify(chunk, ())
            await asyncio.sleep(0)  # a 100k import never holds the loop for long

    async def remove_many(self, targets: Sequence[str]) -> list[str]:
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
        return {"count": len(self.banlist), "source": "local", "last_change_ms": self.last_change_ms}

    def _notify(self, added: Sequence[Ban], removed: Sequence[str]) -> None:
        self.last_change_ms = epoch_ms()
        if not added and not removed:
            return
        for listener in self.listeners:
            listener(added, removed)

    async def start(self) -> None:
        self._expiry = spawn(run_expiry(self.banlist))

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry


class WorkerBans:
    """A worker's copy, fed by the master (``SharedStoreClient.on_bans``): changes, or the whole list on connect."""

    def __init__(self, banlist: BanList) -> None:
        self.banlist = banlist
        self._snapshot: set[str] | None = None  # targets of the list being received

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
