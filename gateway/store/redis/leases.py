"""limit_conn leases in Redis: who holds which slot, their release and renewal.

A slot is a member of a sorted set scored by its lease end. This process names its
members (host, pid, random, sequence), remembers the live ones, releases them
through the batcher (they ride in the next batch) and pushes their lease end every
``renew_every_s`` (also through the batcher), so a node that dies holds its slots
for one lease at most.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable

from gateway.store.redis.batcher import Batcher

RENEW_CHUNK = 1000  # members per ZADD in one renewal operation


class Leases:
    def __init__(self, batcher: Batcher, slot: Callable[[bytes], int], clock_ms: Callable[[], int]) -> None:
        self.batcher = batcher
        self.slot = slot
        self.clock_ms = clock_ms
        self.live: dict[bytes, list[bytes]] = {}  # member -> the keys it holds a slot in
        self._prefix = f"{os.uname().nodename}:{os.getpid()}:{os.urandom(3).hex()}:".encode()
        self._seq = 0

    def next_member(self) -> bytes:
        self._seq += 1
        return self._prefix + str(self._seq).encode()

    def hold(self, member: bytes, keys: list[bytes]) -> None:
        self.live[member] = keys

    def release(self, member: bytes, keys: Iterable[bytes]) -> None:
        """Give back ``member``'s slots in ``keys``: one operation per slot, in the next batch."""
        self.live.pop(member, None)
        keys = list(keys)
        if len(keys) == 1:
            self.batcher.release(self.slot(keys[0]), keys, member)
            return
        by_slot: dict[int, list[bytes]] = {}
        for key in keys:
            by_slot.setdefault(self.slot(key), []).append(key)
        for slot, slot_keys in by_slot.items():
            self.batcher.release(slot, slot_keys, member)

    def release_later(self, member: bytes, keys: list[bytes], delay_s: float) -> None:
        asyncio.get_running_loop().call_later(delay_s, self.release, member, keys)

    def renew(self, lease_ms: int) -> None:
        """Push the lease end of every live member, and each set's own expiry (2 leases)."""
        if not self.live:
            return
        until = self.clock_ms() + lease_ms
        by_key: dict[bytes, list[bytes]] = {}
        for member, keys in self.live.items():
            for key in keys:
                by_key.setdefault(key, []).append(member)
        for key, members in by_key.items():
            for start in range(0, len(members), RENEW_CHUNK):
                chunk = members[start : start + RENEW_CHUNK]
                self.batcher.renew(self.slot(key), key, until, lease_ms * 2, chunk)

    async def renew_every(self, every_s: Callable[[], float], lease_ms: Callable[[], int]) -> None:
        while True:
            await asyncio.sleep(every_s())
            self.renew(lease_ms())
