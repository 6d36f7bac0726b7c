"""Manual bans: an IP or CIDR, until a time, with a reason; enforced on every route.

Every serving process keeps a ``BanList``, compiled for a fast check; the request
path only ever reads that local copy. Where the bans are kept:

* with ``store.redis``: a hash ``<prefix>gateway:bans`` (field: the CIDR, value: JSON)
  shared by all nodes; a change is published on the channel of the same name, so
  every node updates its copy at once, and each node also re-reads the hash every
  ``bans.sync_interval`` in case it missed a message;
* with the embedded store: in the process that serves the admin API (the only
  process, or the master of several workers, which pushes changes to them).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from gateway import errorlog
from gateway.background import spawn
from gateway.realip import ClientAddr


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Ban:
    target: str  # canonical CIDR: "203.0.113.7/32", "2001:db8::/48"
    until_ms: int  # epoch ms; 0 = until lifted by hand
    reason: str = ""
    created_ms: int = 0
    by: str = ""

    def active(self, now_ms: int) -> bool:
        return self.until_ms == 0 or self.until_ms > now_ms

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(text: str | bytes) -> Ban:
        data = json.loads(text)
        return Ban(
            target=str(data["target"]),
            until_ms=int(data.get("until_ms", 0)),
            reason=str(data.get("reason", "")),
            created_ms=int(data.get("created_ms", 0)),
            by=str(data.get("by", "")),
        )


def canonical_target(text: str) -> str:
    """``1.2.3.4`` -> ``1.2.3.4/32``; raises ValueError for anything that is not an address or CIDR."""
    try:
        return str(ipaddress.ip_network(text.strip(), strict=False))
    except ValueError:
        raise ValueError(f"not an IP address or CIDR: {text!r}") from None


class BanList:
    """The local copy: prefix length -> {network as int: ban}, per address family."""

    def __init__(self) -> None:
        self.bans: dict[str, Ban] = {}
        self._tables: dict[int, tuple[tuple[int, dict[int, Ban]], ...]] = {4: (), 6: ()}

    def __len__(self) -> int:
        return len(self.bans)

    def replace(self, bans: Iterable[Ban]) -> None:
        self.bans = {b.target: b for b in bans}
        self._compile()

    def put(self, ban: Ban) -> None:
        self.bans[ban.target] = ban
        self._compile()

    def remove(self, target: str) -> None:
        if self.bans.pop(target, None) is not None:
            self._compile()

    def _compile(self) -> None:
        tables: dict[int, dict[int, dict[int, Ban]]] = {4: {}, 6: {}}
        for ban in self.bans.values():
            net = ipaddress.ip_network(ban.target)
            bits = 32 if net.version == 4 else 128
            mask = ((1 << bits) - 1) ^ ((1 << (bits - net.prefixlen)) - 1)
            tables[net.version].setdefault(mask, {})[int(net.network_address)] = ban
        self._tables = {v: tuple(sorted(t.items(), reverse=True)) for v, t in tables.items()}

    def match(self, addr: ClientAddr, now_ms: int) -> Ban | None:
        """The ban covering ``addr``, if one is in force (the most specific one)."""
        tables = self._tables.get(addr.version)
        if not tables:
            return None
        value = addr.value
        for mask, nets in tables:
            ban = nets.get(value & mask)
            if ban is not None and ban.active(now_ms):
                return ban
        return None

    def active(self, now_ms: int) -> list[Ban]:
        return sorted((b for b in self.bans.values() if b.active(now_ms)), key=lambda b: b.target)


class LocalBans:
    """Bans kept in this process (embedded store); ``listeners`` hear every change."""

    def __init__(self, banlist: BanList) -> None:
        self.banlist = banlist
        self.listeners: list[Callable[[list[Ban]], None]] = []

    async def add(self, ban: Ban) -> None:
        self.banlist.put(ban)
        self._notify()

    async def remove(self, target: str) -> bool:
        found = target in self.banlist.bans
        self.banlist.remove(target)
        self._notify()
        return found

    async def list(self) -> list[Ban]:
        return self.banlist.active(epoch_ms())

    def _notify(self) -> None:
        snapshot = list(self.banlist.bans.values())
        for listener in self.listeners:
            listener(snapshot)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


_DELETE_IF_UNCHANGED = """
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return 0
"""


class RedisBans:
    """Bans kept in Redis and followed through pub/sub plus a periodic re-read."""

    def __init__(
        self,
        client: Any,
        prefix: bytes,
        banlist: BanList,
        *,
        sync_interval_s: float,
        subscriber: Callable[[], Any] | None = None,
        timeout_s: float = 1.0,
    ) -> None:
        self.client = client
        self.key = prefix + b"gateway:bans"
        self.channel = self.key
        self.banlist = banlist
        self.sync_interval_s = sync_interval_s
        self.timeout_s = timeout_s
        self._subscriber = subscriber  # makes a plain Redis client for SUBSCRIBE (None: no following)
        self._tasks: list[asyncio.Task[Any]] = []

    # -- changes (CLI, admin API) ---------------------------------------------------------------------
    async def add(self, ban: Ban) -> None:
        await self.client.hset(self.key, ban.target, ban.to_json())
        await self.client.publish(self.channel, json.dumps({"op": "add", "ban": json.loads(ban.to_json())}))
        self.banlist.put(ban)

    async def remove(self, target: str) -> bool:
        removed = bool(await self.client.hdel(self.key, target))
        await self.client.publish(self.channel, json.dumps({"op": "remove", "target": target}))
        self.banlist.remove(target)
        return removed

    async def list(self) -> list[Ban]:
        await self.sync()
        return self.banlist.active(epoch_ms())

    # -- following --------------------------------------------------------------------------------------
    async def start(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.sync(), self.timeout_s)
        if self._subscriber is not None:
            self._tasks.append(spawn(self._follow()))
        self._tasks.append(spawn(self._resync()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def sync(self) -> None:
        raw = await self.client.hgetall(self.key)
        now = epoch_ms()
        bans = []
        expired: list[tuple[bytes, bytes]] = []
        for field, value in raw.items():
            try:
                ban = Ban.from_json(value)
            except (ValueError, KeyError):
                continue
            if ban.active(now):
                bans.append(ban)
            else:
                expired.append((field, value))
        self.banlist.replace(bans)
        if expired:
            # Delete an expired entry only if it is still the one read: an operator may have
            # banned the same target again in between.
            await self.client.eval(_DELETE_IF_UNCHANGED, 1, self.key, *[x for pair in expired for x in pair])

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await asyncio.wait_for(self.sync(), self.timeout_s)
            except Exception as exc:  # Redis down: keep the copy we have
                errorlog.log.warning("could not re-read the ban list from Redis: %r", exc)

    async def _follow(self) -> None:
        assert self._subscriber is not None
        while True:
            client = self._subscriber()
            try:
                pubsub = client.pubsub()
                await pubsub.subscribe(self.channel)
                await asyncio.wait_for(self.sync(), self.timeout_s)  # catch up on what we missed
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._apply(message["data"])
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await client.aclose()
                raise
            except Exception as exc:
                errorlog.log.warning("ban list subscription lost (%r); retrying", exc)
            with contextlib.suppress(Exception):
                await client.aclose()
            await asyncio.sleep(0.5)

    def _apply(self, data: bytes | str) -> None:
        try:
            event = json.loads(data)
            if event["op"] == "add":
                self.banlist.put(Ban.from_json(json.dumps(event["ban"])))
            elif event["op"] == "remove":
                self.banlist.remove(str(event["target"]))
        except (ValueError, KeyError, TypeError) as exc:
            errorlog.log.warning("ignoring a malformed ban event: %r", exc)
