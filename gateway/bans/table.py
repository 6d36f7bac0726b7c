"""The local ban table: every change O(1), every lookup one dict probe per prefix length.

``BanList`` keeps, per address family, one dict per prefix length present
(network as int -> ban). Adding or removing a ban touches one dict; the ordered
tuple of (mask, dict) that ``match`` walks is rebuilt only when a prefix length
appears or disappears (at most 33 or 129 of them). Timed bans also go in a heap
by end time, so expired ones leave without a scan of the whole table.
"""

from __future__ import annotations

import gc
import heapq
import ipaddress
import json
import socket
import sys
from collections.abc import Iterable
from typing import Any, NamedTuple

from gateway.clock import epoch_ms
from gateway.http.realip import ClientAddr

FREEZE_EVERY = 5000
_BITS = {4: 32, 6: 128}
_QUOTE = json.encoder.encode_basestring_ascii  # a str as a JSON string (C, no call overhead)
_FAMILY = {4: socket.AF_INET, 6: socket.AF_INET6}


class Ban(NamedTuple):
    """One ban. A tuple of strings and ints: after one pass the garbage collector stops tracking
    it (and the dicts that hold only such), so a 100,000-entry list costs full collections nothing."""

    target: str  # canonical CIDR: "203.0.113.7/32", "2001:db8::/48"
    until_ms: int  # epoch ms; 0 = until lifted by hand
    reason: str = ""
    created_ms: int = 0
    by: str = ""

    def active(self, now_ms: int) -> bool:
        return self.until_ms == 0 or self.until_ms > now_ms

    def to_json(self) -> str:
        quote = _QUOTE
        return (
            f'{{"target":{quote(self.target)},"until_ms":{int(self.until_ms)},"reason":{quote(self.reason)},'
            f'"created_ms":{int(self.created_ms)},"by":{quote(self.by)}}}'
        )

    @staticmethod
    def from_json(text: str | bytes) -> Ban:
        return Ban.from_dict(json.loads(text))

    @staticmethod
    def from_dict(data: Any) -> Ban:
        """A ban from its decoded JSON form; KeyError, TypeError or ValueError if it is not one."""
        if not isinstance(data, dict):
            raise TypeError("a ban is not an object")
        return Ban(
            target=str(data["target"]),
            until_ms=int(data.get("until_ms", 0)),
            # Thousands of bans of one feed share these: keep one copy of each.
            reason=sys.intern(str(data.get("reason", ""))),
            created_ms=int(data.get("created_ms", 0)),
            by=sys.intern(str(data.get("by", ""))),
        )


def _mask(version: int, prefixlen: int) -> int:
    bits = _BITS[version]
    return ((1 << bits) - 1) ^ ((1 << (bits - prefixlen)) - 1)


_MASKS = {(v, p): _mask(v, p) for v, bits in _BITS.items() for p in range(bits + 1)}


def mask_of(version: int, prefixlen: int) -> int:
    return _MASKS[(version, prefixlen)]


def net_key(target: str) -> tuple[int, int, int]:
    """``"10.1.0.0/16"`` -> (4, 16, network as int); raises ValueError (fast: no ipaddress objects)."""
    addr, slash, plen_text = target.partition("/")
    version = 6 if ":" in addr else 4
    try:
        raw = socket.inet_pton(_FAMILY[version], addr)
    except OSError:
        raise ValueError(f"not an IP address or CIDR: {target[:64]!r}") from None
    bits = _BITS[version]
    if not slash:
        plen = bits
    elif plen_text.isdigit() and plen_text.isascii() and len(plen_text) <= 3 and int(plen_text) <= bits:
        plen = int(plen_text)
    else:
        raise ValueError(f"not an IP address or CIDR: {target[:64]!r}")
    return version, plen, int.from_bytes(raw, "big") & _MASKS[(version, plen)]


_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def canonical_target(text: str) -> str:
    """``1.2.3.4`` -> ``1.2.3.4/32``; raises ValueError for anything that is not an address or CIDR.

    The common forms take a fast path (inet_pton/inet_ntop, about 30 times cheaper than
    ``ipaddress``, which matters for a 100,000-line blocklist); anything unusual (an IPv6
    address with an embedded IPv4 part, a prefix mask) goes through ``ipaddress``. An
    IPv4-mapped IPv6 target (``::ffff:203.0.113.9``) is the IPv4 network it maps.
    """
    stripped = text.strip()
    try:
        version, plen, net = net_key(stripped)
        out = socket.inet_ntop(_FAMILY[version], net.to_bytes(_BITS[version] // 8, "big"))
        if "." not in out or version == 4:
            return f"{out}/{plen}"
    except ValueError:
        pass
    try:
        network = ipaddress.ip_network(stripped, strict=False)
    except ValueError:
        raise ValueError(f"not an IP address or CIDR: {stripped[:64]!r}") from None
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96 and network.subnet_of(_MAPPED):
        # ::ffff:a.b.c.d is how an IPv6 socket names an IPv4 client: the ban is on that IPv4 network
        # (and the width policy sees ::ffff:0.0.0.0/96 for what it is, all of IPv4).
        v4 = ipaddress.IPv4Address(int(network.network_address) & 0xFFFFFFFF)
        return f"{v4}/{network.prefixlen - 96}"
    return str(network)


def overlaps(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    """Whether two networks given as ``net_key`` tuples share an address."""
    if a[0] != b[0]:
        return False
    mask = mask_of(a[0], min(a[1], b[1]))
    return a[2] & mask == b[2] & mask


class CidrSet:
    """A static set of CIDRs (``access.allow``/``deny``) built like the ban table: one set per prefix length."""

    def __init__(self, keys: Iterable[tuple[int, int, int]]) -> None:  # (version, prefix length, network)
        by_len: dict[tuple[int, int], set[int]] = {}
        for version, plen, net in keys:
            by_len.setdefault((version, plen), set()).add(net)
        self.size = sum(len(nets) for nets in by_len.values())
        self._tables = {
            version: tuple(
                (mask_of(version, plen), by_len[(version, plen)])
                for plen in sorted((p for v, p in by_len if v == version), reverse=True)
            )
            for version in (4, 6)
        }

    def __bool__(self) -> bool:
        return self.size > 0

    def __len__(self) -> int:
        return self.size

    def __contains__(self, addr: ClientAddr) -> bool:
        value = addr.value
        for mask, nets in self._tables.get(addr.version, ()):
            if value & mask in nets:
                return True
        return False


class BanList:
    """The local copy of the bans; the request path only calls ``match``."""

    def __init__(self) -> None:
        self.bans: dict[str, Ban] = {}
        self._by_len: dict[tuple[int, int], dict[int, Ban]] = {}
        self._tables: dict[int, tuple[tuple[int, dict[int, Ban]], ...]] = {4: (), 6: ()}
        self._expiry: list[tuple[int, str]] = []  # (until_ms, target), stale entries skipped when popped
        self._unfrozen = 0  # bans put since the last gc.freeze()

    def __len__(self) -> int:
        return len(self.bans)

    def put(self, ban: Ban) -> None:
        """Add or replace one ban: O(1). Raises ValueError for a target that is not a CIDR."""
        version, plen, net = net_key(ban.target)
        old = self.bans.get(ban.target)
        if old is not None:
            self._unlink(old.target)
        self.bans[ban.target] = ban
        table = self._by_len.get((version, plen))
        if table is None:
            table = self._by_len[(version, plen)] = {}
            table[net] = ban
            self._rebuild(version)
        else:
            table[net] = ban
        self._unfrozen += 1
        if self._unfrozen >= FREEZE_EVERY:
            # The table is long-lived: keep it out of the cyclic collector's full passes, which
            # would otherwise walk every ban (20-50 ms pauses at 100,000 bans). The price: cyclic
            # garbage alive at this instant is never collected; at most once per FREEZE_EVERY bans.
            self._unfrozen = 0
            gc.freeze()
        if ban.until_ms:
            heapq.heappush(self._expiry, (ban.until_ms, ban.target))
            if len(self._expiry) > 2 * len(self.bans) + 1024:
                self._compact_expiry()

    def remove(self, target: str) -> bool:
        """Remove one ban: O(1). False when ``target`` was not banned."""
        if self.bans.pop(target, None) is None:
            return False
        self._unlink(target)
        return True

    def replace(self, bans: Iterable[Ban]) -> None:
        """Make the table hold exactly ``bans`` (changes only what differs)."""
        wanted = {b.target: b for b in bans}
        for target in [t for t in self.bans if t not in wanted]:
            self.remove(target)
        for target, ban in wanted.items():
            if self.bans.get(target) != ban:
                self.put(ban)

    def _unlink(self, target: str) -> None:
        version, plen, net = net_key(target)
        table = self._by_len.get((version, plen))
        if table is None:
            return
        table.pop(net, None)
        if not table:
            del self._by_len[(version, plen)]
            self._rebuild(version)

    def _rebuild(self, version: int) -> None:
        """The walk order for one family: most specific prefix first."""
        lengths = sorted((plen for v, plen in self._by_len if v == version), reverse=True)
        self._tables[version] = tuple((mask_of(version, plen), self._by_len[(version, plen)]) for plen in lengths)

    def _compact_expiry(self) -> None:
        self._expiry = [(b.until_ms, b.target) for b in self.bans.values() if b.until_ms]
        heapq.heapify(self._expiry)

    def purge_expired(self, now_ms: int, limit: int = 2000) -> int:
        """Drop up to ``limit`` bans that have ended; the cost is that of what leaves."""
        removed = 0
        expiry = self._expiry
        while expiry and expiry[0][0] <= now_ms and removed < limit:
            until, target = heapq.heappop(expiry)
            ban = self.bans.get(target)
            if ban is not None and ban.until_ms == until:
                self.remove(target)
                removed += 1
        return removed

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

    def prefix_lengths(self) -> dict[int, tuple[int, ...]]:
        return {v: tuple(sorted(p for vv, p in self._by_len if vv == v)) for v in (4, 6)}

    def active(self, now_ms: int) -> list[Ban]:
        return sorted((b for b in self.bans.values() if b.active(now_ms)), key=lambda b: b.target)

    async def select(
        self, now_ms: int, *, within: str | None = None, reason: str | None = None, offset: int = 0, limit: int = 0
    ) -> tuple[int, list[Ban]]:
        """(how many bans in force match, one page of them, sorted by target); ``limit`` 0 = all.

        Filtering and sorting 100,000 bans takes tens of ms: done in a thread, on a snapshot,
        so the loop that serves traffic keeps running.
        """
        import asyncio

        snapshot = list(self.bans.values())
        return await asyncio.to_thread(select_bans, snapshot, now_ms, within, reason, offset, limit)


def select_bans(
    bans: list[Ban], now_ms: int, within: str | None, reason: str | None, offset: int, limit: int
) -> tuple[int, list[Ban]]:
    area = net_key(canonical_target(within)) if within else None
    found = [
        b
        for b in bans
        if b.active(now_ms)
        and (reason is None or b.reason == reason)
        and (area is None or overlaps(net_key(b.target), area))
    ]
    found.sort(key=lambda b: b.target)
    end = offset + limit if limit else len(found)
    return len(found), found[offset:end]


async def run_expiry(banlist: BanList, every_s: float = 1.0) -> None:
    """Drop ended bans from ``banlist`` now and then, a bounded number per step."""
    import asyncio

    while True:
        await asyncio.sleep(every_s)
        while banlist.purge_expired(epoch_ms(), limit=2000) == 2000:
            await asyncio.sleep(0)
