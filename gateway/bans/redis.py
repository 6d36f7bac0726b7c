"""Bans shared through Redis, followed incrementally by every node.

Keys (all in the hash slot of the first one, so each change is one atomic script):

* ``<prefix>gateway:bans``            hash: CIDR -> ban JSON (the list itself);
* ``{<prefix>gateway:bans}:version``  a counter, +1 per batch of changes;
* ``{<prefix>gateway:bans}:log``      a stream with one entry per batch, ID ``<version>-0``,
  listing the targets it touched (the last ``LOG_MAXLEN`` batches are kept);
* ``{<prefix>gateway:bans}:expiry``   sorted set: CIDR scored by its end (timed bans only);
* ``{<prefix>gateway:bans}:epoch``    a random token, set by the first node that reads the list:
  when it changes (or is gone), Redis lost the list;
* ``{<prefix>gateway:bans}:removed``  sorted set: CIDR scored by when it was unbanned, written
  only when a lost list is put back, and kept ``REMOVED_KEEP_MS``.

A batch (up to ``WRITE_CHUNK`` bans, many batches pipelined) is one script,
``scripts/lua/ban_write.lua`` (the other two: ``ban_expire.lua``, ``ban_delete_if_unchanged.lua``): it writes
the hash and the expiry index, bumps the version, appends to the log and publishes
``<version>\\n<JSON array of bans added>\\n<removed target>...`` on the channel
``<prefix>gateway:bans``. A node applies a message whose version follows its own at
once; if it sees a gap, or at start, or when its subscription comes back, it catches up
from the log (re-reading only the touched targets), or, if the log no longer reaches
back far enough, reads the whole hash with HSCAN in chunks. All of that runs on a
connection of its own with its own deadline (``SYNC_TIMEOUT_S`` per call), never the
request path's; the node keeps serving meanwhile, yielding between chunks. Every
``sync_interval`` a node compares the counter and the epoch (one ``MGET``) and sweeps
ended bans out of Redis through the expiry index, with no scan of the list.

A list lost by Redis (a restart without persistence, a failover to an empty or late
replica) shows as an epoch that changed or vanished, or a counter lower than the node's.
The node then puts back the bans it still holds, with their own expiry, reason and
creation time, through ``ban_restore.lua``, then reads the list again. Several nodes may
do it at once; the rule (in the script) makes the result the same in any order: an unban
wins over a ban created before it. Each node remembers, for ``REMOVED_KEEP_MS``, the
targets it unbanned or heard unbanned (and does not hold since); it sends them along, so
a node that missed an unban just before the loss cannot bring the ban back, and an entry
is put back only where the list holds none created at the same time or later (no
duplicate; a newer ban is kept). The count is ``restored_total``
(``gateway_bans_restored_total``), and the error log says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
from collections.abc import Callable, Coroutine, Iterator, Sequence
from functools import cache
from importlib import resources
from typing import Any, TypeVar

from gateway.background import spawn
from gateway.bans.table import Ban, BanList, run_expiry
from gateway.clock import epoch_ms
from gateway.errors import ScriptsMissing
from gateway.logs import error as errorlog

T = TypeVar("T")

WRITE_CHUNK = 500  # bans per script call (and per pub/sub message: applied in one go on every node)
WRITE_PIPELINE = 8  # script calls per round trip
WRITES_IN_FLIGHT = 2  # round trips at once (two connections)
SCAN_COUNT = 1000  # HSCAN COUNT
SCAN_PAUSE_S = 0.003  # between two HSCAN chunks
APPLY_SLICE = 100  # bans applied between two yields to the loop
LOG_MAXLEN = 1000  # batches kept in the change log
SYNC_TIMEOUT_S = 5.0  # one Redis call of the sync (a full read is many such calls)
FULL_SYNC_DEADLINE_S = 120.0
EXPIRE_PER_SWEEP = 1000

# The three scripts live in scripts/lua/ beside the store's, shipped as the package data of
# ``gateway.lua`` and read the same way as gateway/store/lua.py reads those (not through it:
# the store imports the bans, for the workers of ``workers: N``).
SCRIPTS_PACKAGE = "gateway.lua"
WRITE_SCRIPT = "ban_write.lua"  # one batch of adds or removes: hash, expiry index, version, log, publish
EXPIRE_SCRIPT = "ban_expire.lua"  # the ended bans, through the expiry index, as one batch
DELETE_IF_UNCHANGED_SCRIPT = "ban_delete_if_unchanged.lua"  # ended entries a full read found
RESTORE_SCRIPT = "ban_restore.lua"  # put back what a node holds after Redis lost the list
SCRIPTS = (WRITE_SCRIPT, EXPIRE_SCRIPT, DELETE_IF_UNCHANGED_SCRIPT, RESTORE_SCRIPT)
REMOVED_KEEP_MS = 3_600_000  # how long an unban is remembered, to keep it through a loss
REMOVED_MAX = 200_000  # unbans remembered at most (the oldest are forgotten first)


@cache
def script_source(name: str) -> str:
    """One ban script as installed; ScriptsMissing when the gateway was installed without it."""
    try:
        return resources.files(SCRIPTS_PACKAGE).joinpath(name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, OSError) as exc:
        raise ScriptsMissing(
            f"cannot load the Redis script {name} from the {SCRIPTS_PACKAGE} package ({type(exc).__name__}: {exc}); "
            "the gateway is installed without its Lua scripts: reinstall it from a wheel or a checkout"
        ) from None


def require_scripts() -> None:
    """Read every ban script, or raise ScriptsMissing: called before a Redis-backed start."""
    for name in SCRIPTS:
        script_source(name)


class LogGap(Exception):
    """The change log no longer reaches back to this node's version: read everything."""


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def companion_keys(key: bytes) -> tuple[bytes, bytes, bytes]:
    """(version, log, expiry) keys in the cluster slot of ``key``."""
    tag = key if b"{" in key else b"{" + key + b"}"  # a prefix with a hash tag already pins the slot
    return tag + b":version", tag + b":log", tag + b":expiry"


def restore_keys(key: bytes) -> tuple[bytes, bytes]:
    """(epoch, removed) keys in the cluster slot of ``key``."""
    version = companion_keys(key)[0]
    tag = version[: -len(b":version")]
    return tag + b":epoch", tag + b":removed"


class Changes:
    """One published batch: its version, the bans it added or replaced, the targets it removed."""

    __slots__ = ("added", "removed", "version")

    def __init__(self, version: int, added: list[Ban], removed: list[str]) -> None:
        self.version = version
        self.added = added
        self.removed = removed

    @staticmethod
    def parse(data: bytes | str) -> Changes:
        text = _text(data)
        head, _, rest = text.partition("\n")
        adds, _, removed = rest.partition("\n")
        raw = json.loads(adds) if adds else []
        if not isinstance(raw, list):
            raise TypeError("the bans of a change are not a list")
        added = [Ban.from_dict(item) for item in raw]
        return Changes(int(head), added, [t for t in removed.split("\n") if t])


def decode_bans(values: Sequence[bytes | str]) -> list[Ban | None]:
    """Ban JSON values, decoded in one go (None for one that is not a ban)."""
    raw: list[Any] | None = None
    if values and all(isinstance(v, bytes) for v in values):
        with contextlib.suppress(ValueError):
            raw = json.loads(b"[" + b",".join(values) + b"]")  # type: ignore[arg-type]
    if raw is None or len(raw) != len(values):  # a bad value among them: one at a time
        raw = []
        for value in values:
            try:
                raw.append(json.loads(value))
            except ValueError:
                raw.append(None)
    out: list[Ban | None] = []
    for item in raw:
        try:
            out.append(Ban.from_dict(item))
        except (ValueError, KeyError, TypeError):
            out.append(None)
    return out


class RedisBans:
    """Bans kept in Redis; with a ``subscriber``, this node's ``banlist`` follows them."""

    def __init__(
        self,
        client: Any,
        prefix: bytes,
        banlist: BanList,
        *,
        sync_interval_s: float,
        subscriber: Callable[[], Any] | None = None,
        timeout_s: float = SYNC_TIMEOUT_S,
        owns_client: bool = False,
    ) -> None:
        self.client = client  # for writes and the sync: its own connections, not the request path's
        self.key = prefix + b"gateway:bans"
        self.version_key, self.log_key, self.expiry_key = companion_keys(self.key)
        self.epoch_key, self.removed_key = restore_keys(self.key)
        self.channel = self.key
        self.banlist = banlist
        self.sync_interval_s = sync_interval_s
        self.timeout_s = timeout_s
        self.owns_client = owns_client
        self._subscriber = subscriber  # makes a plain Redis client for SUBSCRIBE (None: no following)
        self._tasks: list[asyncio.Task[Any]] = []
        self.version: int | None = None  # the last batch applied in order; None: never read in full
        self.last_sync_ms = 0  # when this node last knew it was current
        self.last_error = ""
        self.full_syncs = 0
        self._buffer: list[Changes] | None = None  # batches heard while a read is in flight
        self.epoch: bytes | None = None  # the list's epoch token when last read
        self.removed: dict[str, int] = {}  # target -> when this node unbanned or heard it unbanned
        self.losses = 0  # times this node found the list lost
        self.restored_total = 0  # bans it put back
        self._lock = asyncio.Lock()
        self._kick = asyncio.Event()

    def _keys(self) -> tuple[bytes, bytes, bytes, bytes]:
        return self.key, self.expiry_key, self.version_key, self.log_key

    @property
    def following(self) -> bool:
        """Whether this process keeps its ban table current from Redis (a serving node)."""
        return self._subscriber is not None

    # -- the local table, and what this node knows was unbanned -----------------------------------------
    def _put(self, ban: Ban) -> None:
        self.banlist.put(ban)
        if self.removed:
            self.removed.pop(ban.target, None)

    def _drop(self, target: str, now_ms: int) -> None:
        """Remove ``target`` from the table; remember the unban (not the end of a ban that ended)."""
        held = self.banlist.bans.get(target)
        self.banlist.remove(target)
        if held is None or not held.active(now_ms):
            return
        removed = self.removed
        removed.pop(target, None)
        removed[target] = now_ms  # insertion order is age order
        if len(removed) > REMOVED_MAX:
            for old in list(removed)[: len(removed) - REMOVED_MAX]:
                del removed[old]

    def _recent_removals(self, now_ms: int) -> list[tuple[str, int]]:
        horizon = now_ms - REMOVED_KEEP_MS
        for target in [t for t, at in self.removed.items() if at <= horizon]:
            del self.removed[target]
        return list(self.removed.items())

    async def _call(self, call: Any) -> Any:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the result when a
        # cancellation arrives just as its call completes, and a cancelled loop goes on forever
        # (close() then never returns); the same holds for the waits of _sync_loop and _buffered.
        async with asyncio.timeout(self.timeout_s):
            return await call

    # -- changes (CLI, admin API) ---------------------------------------------------------------------
    async def add(self, ban: Ban) -> None:
        await self.add_many([ban])

    async def remove(self, target: str) -> bool:
        return bool(await self.remove_many([target]))

    async def add_many(self, bans: Sequence[Ban]) -> None:
        calls = []
        for chunk in _chunks(bans, WRITE_CHUNK):
            targets = "\n".join(b.target for b in chunk)
            calls.append(
                ("+", targets, "\n".join(b.to_json() for b in chunk), "\n".join(str(b.until_ms) for b in chunk))
            )
        await self._write(calls)
        if self._subscriber is None:
            return  # the CLI: no local copy to keep
        for piece in _chunks(bans, APPLY_SLICE):
            for ban in piece:
                self._put(ban)
            await asyncio.sleep(0)

    async def remove_many(self, targets: Sequence[str]) -> list[str]:
        found = await self._write([("-", "\n".join(chunk), "", "") for chunk in _chunks(targets, WRITE_CHUNK)])
        for chunk in _chunks(targets, APPLY_SLICE * 10):
            now = epoch_ms()
            for target in chunk:
                self._drop(target, now)
            await asyncio.sleep(0)
        return found

    async def _write(self, calls: Sequence[tuple[str, str, str, str]]) -> list[str]:
        """Run the write script once per chunk, WRITE_PIPELINE calls per round trip, two round trips
        in flight (we pack one while Redis runs the other). Each call is atomic and numbered by
        the version it takes; nodes apply them in that order whatever order they were sent in."""
        found: list[str] = []
        in_flight = asyncio.Semaphore(WRITES_IN_FLIGHT)

        async def send(group: Sequence[tuple[str, str, str, str]]) -> None:
            async with in_flight:
                pipe = self.client.pipeline(transaction=False)
                for call in group:
                    pipe.eval(script_source(WRITE_SCRIPT), 4, *self._keys(), self.channel, LOG_MAXLEN, *call)
                for reply in await self._call(pipe.execute()):
                    found.extend(_text(t) for t in reply[1:])

        await asyncio.gather(*(send(group) for group in _chunks(calls, WRITE_PIPELINE)))
        return found

    async def select(
        self, *, within: str | None = None, reason: str | None = None, offset: int = 0, limit: int = 0
    ) -> tuple[int, list[Ban]]:
        await self.refresh()  # one GET when nothing changed; fails (so the caller says so) when Redis is down
        return await self.banlist.select(epoch_ms(), within=within, reason=reason, offset=offset, limit=limit)

    def status(self) -> dict[str, Any]:
        return {
            "count": len(self.banlist),
            "source": "redis",
            "version": self.version,
            "last_sync_ms": self.last_sync_ms,
            "last_sync_error": self.last_error or None,
            "full_syncs": self.full_syncs,
            "losses": self.losses,
            "restored": self.restored_total,
        }

    # -- following --------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start following in the background: the node serves while it reads the list.

        Without a subscriber (the CLI, the master of Redis-backed workers) nothing runs:
        ``select`` reads what changed when asked.
        """
        if self._subscriber is None:
            return
        self._tasks.append(spawn(self._follow()))
        self._tasks.append(spawn(self._sync_loop()))
        self._tasks.append(spawn(run_expiry(self.banlist)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.owns_client:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.aclose(), 1.0)

    async def refresh(self) -> None:
        """Make the local copy current: nothing if the version did not move, else what changed.

        A list Redis lost is put back first (``_restore``), from this node's copy."""
        async with self._lock:
            raw, epoch = await self._call(self.client.mget([self.version_key, self.epoch_key]))
            current = int(raw or 0)
            lost = self._loss(current, epoch)
            if epoch is None:
                epoch = await self._ensure_epoch()
            if lost and self._subscriber is not None:
                await self._restore(lost)
                self.version = None  # read it all again: what the other nodes put back too
            self.epoch = epoch
            if self.version is None or current < self.version:
                await self._buffered(self._read_all())
            elif current > self.version:
                await self._buffered(self._catch_up_or_read_all())
            self.last_sync_ms = epoch_ms()
            self.last_error = ""

    def _loss(self, current: int, epoch: bytes | None) -> str:
        """Why the list in Redis is not the one this node last read ("" when it is)."""
        if self.version is None or self.epoch is None:
            return ""  # never read: nothing to compare with
        if epoch is None:
            return "its keys are gone"
        if epoch != self.epoch:
            return "its epoch changed"
        if current < self.version:
            return f"its version went back from {self.version} to {current}"
        return ""

    async def _ensure_epoch(self) -> bytes:
        token = f"{epoch_ms()}-{os.urandom(6).hex()}".encode()
        await self._call(self.client.set(self.epoch_key, token, nx=True))
        return bytes(await self._call(self.client.get(self.epoch_key)) or token)

    async def _restore(self, why: str) -> None:
        """Put back the bans this node holds, and the unbans it knows of, by ``ban_restore.lua``."""
        now = epoch_ms()
        held = [ban for ban in self.banlist.bans.values() if ban.active(now)]
        removals = self._recent_removals(now)
        self.losses += 1
        errorlog.log.error(
            "the shared ban list in Redis was lost (%s: a restart without persistence, or a failover); "
            "putting back the %d bans this node holds (and %d recent unbans)",
            why,
            len(held),
            len(removals),
        )
        keys = (*self._keys(), self.removed_key)
        fixed = (self.channel, LOG_MAXLEN, now, REMOVED_KEEP_MS)

        def calls() -> Iterator[tuple[str, ...]]:  # the unbans first, then the bans
            for gone in _chunks(removals, WRITE_CHUNK):
                yield "\n".join(t for t, _ in gone), "\n".join(str(at) for _, at in gone), "", "", "", ""
            for bans in _chunks(held, WRITE_CHUNK):
                targets, values = "\n".join(b.target for b in bans), "\n".join(b.to_json() for b in bans)
                made, ends = "\n".join(str(b.created_ms) for b in bans), "\n".join(str(b.until_ms) for b in bans)
                yield "", "", targets, values, made, ends

        put = deleted = 0
        pending = calls()
        while group := list(itertools.islice(pending, WRITE_PIPELINE)):  # in order, a round trip at a time
            pipe = self.client.pipeline(transaction=False)
            for call in group:
                pipe.eval(script_source(RESTORE_SCRIPT), 5, *keys, *fixed, *call)
            for reply in await self._call(pipe.execute()):
                put += int(reply[1])
                deleted += int(reply[2])
        self.restored_total += put
        errorlog.log.error(
            "put back %d bans in Redis (%d were there already, or unbanned since); "
            "removed %d bans unbanned before the loss",
            put,
            len(held) - put,
            deleted,
        )

    async def expire(self) -> int:
        """Remove up to EXPIRE_PER_SWEEP ended bans from Redis (and, through pub/sub, from every node)."""
        return int(
            await self._call(
                self.client.eval(
                    script_source(EXPIRE_SCRIPT),
                    4,
                    *self._keys(),
                    self.channel,
                    LOG_MAXLEN,
                    epoch_ms(),
                    EXPIRE_PER_SWEEP,
                )
            )
        )

    async def _sync_loop(self) -> None:
        delay = 0.0
        while True:
            if delay:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._kick.wait()
            self._kick.clear()
            try:
                await self.refresh()
                while await self.expire() == EXPIRE_PER_SWEEP:
                    pass
                delay = self.sync_interval_s
            except Exception as exc:  # Redis down or slow: keep the copy we have, try again soon
                if not self.last_error:
                    errorlog.log.warning("could not bring the ban list up to date from Redis: %r", exc)
                self.last_error = f"{type(exc).__name__}: {exc}"[:200]
                delay = min(self.sync_interval_s, 1.0)

    async def _buffered(self, read: Coroutine[Any, Any, None]) -> None:
        """Run a read of Redis; the changes heard meanwhile are applied at once and again after it.

        A read and the subscription are two connections: a change may be heard before the
        reply of a read that predates it is handled. Applying, after the read, the changes
        newer than what it covered, in order, makes the end state right whatever the timing.
        """
        self._buffer = []
        ok = False
        try:
            async with asyncio.timeout(FULL_SYNC_DEADLINE_S):
                await read
            ok = True
        finally:
            self._replay(ok)

    async def _catch_up_or_read_all(self) -> None:
        try:
            await self._catch_up()
        except LogGap:
            await self._read_all()

    async def _read_all(self) -> None:
        start_version = int(await self._call(self.client.get(self.version_key)) or 0)
        seen: set[str] = set()
        expired: list[bytes] = []
        cursor: int = 0
        pending: asyncio.Future[Any] | None
        pending = asyncio.ensure_future(self._call(self.client.hscan(self.key, 0, count=SCAN_COUNT)))
        try:
            while pending is not None:
                cursor, fields = await pending
                # Ask for the next chunk before working on this one: Redis and we work side by side.
                pending = None
                if cursor:
                    pending = asyncio.ensure_future(self._call(self.client.hscan(self.key, cursor, count=SCAN_COUNT)))
                items = list(fields.items())
                for chunk in _chunks(items, APPLY_SLICE):
                    now = epoch_ms()
                    for (field, value), ban in zip(chunk, decode_bans([v for _, v in chunk]), strict=True):
                        target = _text(field)
                        if ban is None or ban.target != target:
                            continue
                        if not ban.active(now):
                            expired += [field, value]
                            continue
                        if self.banlist.bans.get(target) != ban:
                            self._put(ban)
                        seen.add(target)
                    await asyncio.sleep(0)
                # A breath between chunks (the next one is on its way meanwhile): a node reading
                # a long list is not CPU-bound, so the OS schedules it promptly for its requests.
                await asyncio.sleep(SCAN_PAUSE_S)
        finally:
            if pending is not None:
                pending.cancel()
        held = list(self.banlist.bans)
        for chunk in _chunks(held, APPLY_SLICE * 8):
            now = epoch_ms()
            for target in chunk:
                if target not in seen:
                    self._drop(target, now)
            await asyncio.sleep(0)
        self.version = start_version
        await self._catch_up()  # what changed while we read, re-read once more
        self.full_syncs += 1
        for chunk in _chunks(expired, 2 * WRITE_CHUNK):
            # Delete an expired entry only if it is still the one read: an operator may have
            # banned the same target again in between. (Entries without an expiry index.)
            await self._call(self.client.eval(script_source(DELETE_IF_UNCHANGED_SCRIPT), 1, self.key, *chunk))

    async def _catch_up(self) -> None:
        """Apply the batches after ``self.version`` from the log; LogGap if it does not reach back."""
        assert self.version is not None
        touched: set[str] = set()
        version = self.version
        while True:
            entries = await self._call(self.client.xrange(self.log_key, min=f"{version + 1}-0", max="+", count=200))
            for entry_id, fields in entries:
                number = int(_text(entry_id).split("-", 1)[0])
                if number != version + 1:
                    raise LogGap(f"log starts at {number}, this node is at {version}")
                version = number
                raw = fields.get(b"t", fields.get("t", b""))
                touched.update(t for t in _text(raw).split("\n") if t)
            if len(entries) < 200:
                break
        current = int(await self._call(self.client.get(self.version_key)) or 0)
        if version < current and not touched and version == self.version:
            raise LogGap(f"no log after {version}, counter at {current}")
        ordered = sorted(touched)
        for chunk in _chunks(ordered, SCAN_COUNT):
            values = await self._call(self.client.hmget(self.key, list(chunk)))
            now = epoch_ms()
            for piece in _chunks(list(zip(chunk, values, strict=True)), APPLY_SLICE):
                for target, value in piece:
                    ban = None
                    if value is not None:
                        with contextlib.suppress(ValueError, KeyError, TypeError):
                            ban = Ban.from_json(value)
                    if ban is not None and ban.target == target and ban.active(now):
                        self._put(ban)
                    else:
                        self._drop(target, now)
                await asyncio.sleep(0)
        self.version = version

    def _replay(self, ok: bool) -> None:
        """After a read: apply again, in order, the batches heard meanwhile that are newer than it."""
        buffered, self._buffer = self._buffer or [], None
        if not ok:
            return  # they were applied as they came; the version stays unknown, the loop retries
        for changes in buffered:
            assert self.version is not None
            if changes.version > self.version:
                self._apply(changes)
                if changes.version == self.version + 1:
                    self.version = changes.version
                else:
                    self._kick.set()

    async def _follow(self) -> None:
        assert self._subscriber is not None
        while True:
            client = self._subscriber()
            try:
                pubsub = client.pubsub()
                await pubsub.subscribe(self.channel)
                self._kick.set()  # catch up on what we missed, without holding the subscription
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._on_message(message["data"])
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await client.aclose()
                raise
            except Exception as exc:
                errorlog.log.warning("ban list subscription lost (%r); retrying", exc)
            with contextlib.suppress(Exception):
                await client.aclose()
            await asyncio.sleep(0.5)

    def _on_message(self, data: bytes | str) -> None:
        try:
            changes = Changes.parse(data)
        except (ValueError, KeyError, TypeError) as exc:
            errorlog.log.warning("ignoring a malformed ban event: %r", exc)
            return
        if self.version is not None and changes.version <= self.version:
            return  # already in what we read
        self._apply(changes)
        if self._buffer is not None:
            self._buffer.append(changes)  # a read is in flight: replay it after, in order
        elif self.version is not None and changes.version == self.version + 1:
            self.version = changes.version
        else:
            self._kick.set()  # we missed something (or never read it all): catch up

    def _apply(self, changes: Changes) -> None:
        for ban in changes.added:
            try:
                self._put(ban)
            except ValueError:
                continue
        now = epoch_ms()
        for target in changes.removed:
            self._drop(target, now)
