"""nginx's ``limit_conn``: concurrent requests per key.

For each limit in order (empty keys skipped): a key at ``max`` rejects the
request, and every slot this request already took in this pass is given back at
once; otherwise the key's count goes up by one, until the request ends (response
sent, client gone, upstream failed). A rejected request holds no slot, in dry
run too (nginx's code, not its docs). A zone that cannot store a new key
rejects like an over-limit key, without the log line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

MAX_KEY = 255


class ConnTable(Protocol):
    def acquire(self, key: bytes, limit: int) -> int:
        """Take a slot; return the new count, 0 when the key is at ``limit``, -1 when the zone is full."""
        ...

    def release(self, key: bytes) -> None: ...


@dataclass(slots=True)
class ConnDecision:
    rejected: int  # index of the limit that rejected, or -1
    zone_full: bool
    counts: list[int | None]  # per limit, the key's count including this request (None: skipped)
    taken: list[tuple[Any, bytes]]  # slots held: (table, key); a Redis store keeps its own handles

    @property
    def applied(self) -> bool:
        return any(c is not None for c in self.counts) or self.rejected >= 0


def acquire(tables: Sequence[ConnTable], keys: Sequence[bytes], limits: Sequence[int]) -> ConnDecision:
    counts: list[int | None] = [None] * len(limits)
    taken: list[tuple[Any, bytes]] = []
    for i, key in enumerate(keys):
        if not key or len(key) > MAX_KEY:
            continue
        count = tables[i].acquire(key, limits[i])
        if count <= 0:
            for table, held in taken:
                table.release(held)
            counts[i] = limits[i]
            return ConnDecision(i, count < 0, counts, [])
        counts[i] = count
        taken.append((tables[i], key))
    return ConnDecision(-1, False, counts, taken)


def release(taken: Sequence[tuple[Any, bytes]]) -> None:
    for table, key in taken:
        table.release(key)
