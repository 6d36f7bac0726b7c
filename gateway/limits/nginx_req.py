"""nginx's ``limit_req``, exactly: integer milli-requests and an integer millisecond clock.

Per key a zone keeps ``excess`` (milli-requests waiting in the bucket) and
``last`` (ms of the last committed update). One lookup (``ngx_http_limit_req_lookup``):

    ms = now - last; ms < -60000 -> 1; ms < 0 -> 0
    excess = max(0, excess - rate_m * ms // 1000 + 1000)
    excess > burst_m      -> BUSY (nothing written: rejections are never charged)
    last limit of the list -> commit excess, and last = now only if ms != 0 -> OK
    otherwise              -> AGAIN (committed later, only if no later limit rejects)

A key seen for the first time gets excess 0. With several limits the walk stops
at the first BUSY (earlier limits stay uncharged); otherwise every limit is
committed and the longest delay wins (``ngx_http_limit_req_account``):

    delay = 0 if excess <= delay_m else (excess - delay_m) * 1000 // rate_m

On top of nginx, a zone may have a ``ban`` (lua-resty-redis-ratelimit's
``duration``): a key that overflows its burst is then rejected, uncharged, for
``ban`` ms; when the ban ends the key starts again from excess 0.

This module has no I/O and no clock of its own; state lives in a ``ReqTable``
(the embedded store's LRU zone, or a plain dict in tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.limits.params import ReqParams

# lookup results
DECLINED = 0  # no limit had a key: nothing applies
OK = 1
AGAIN = 2
BUSY = 3
ERROR = 4  # the zone could not store a new key (nginx: "could not allocate node")
FORBIDDEN = 5  # the key is banned in this zone

MAX_KEY = 65535
_EXCESS_BITS = 42
_LAST_BITS = 46
_EXCESS_MASK = (1 << _EXCESS_BITS) - 1
_LAST_MASK = (1 << _LAST_BITS) - 1
EXCESS_MASK = _EXCESS_MASK  # a state's excess bits: non-zero while the bucket holds excess
BAN_SHIFT = _EXCESS_BITS + _LAST_BITS  # a state's ban_until starts here: non-zero while banned


def pack(excess: int, last: int, ban_until: int = 0) -> int:
    """One int per key keeps the embedded store small: excess | last | ban_until."""
    return excess | (last << _EXCESS_BITS) | (ban_until << (_EXCESS_BITS + _LAST_BITS))


def unpack(state: int) -> tuple[int, int, int]:
    return (
        state & _EXCESS_MASK,
        (state >> _EXCESS_BITS) & _LAST_MASK,
        state >> (_EXCESS_BITS + _LAST_BITS),
    )


class ReqTable(Protocol):
    """Where one zone's states live. ``get`` counts as a use (LRU), ``peek`` does not."""

    def get(self, key: bytes) -> int | None: ...

    def peek(self, key: bytes) -> int | None: ...

    def put(self, key: bytes, state: int) -> None: ...

    def insert(self, key: bytes, state: int, now: int) -> bool: ...

    def delete(self, key: bytes) -> None: ...


@dataclass(slots=True)
class ReqDecision:
    rc: int  # DECLINED, OK (possibly after AGAIN), BUSY, ERROR or FORBIDDEN
    index: int  # the limit that rejected, or the one whose delay is the longest
    excess: int  # the excess that failed the check, or that of the longest delay
    delay_ms: int
    excesses: list[int | None]  # per limit, excess after this request (None: skipped)
    ban_until: int = 0  # for FORBIDDEN / a new ban: when it ends (ms)
    new_ban: bool = False
    writes: list[tuple[int, bytes, int]] | None = None  # (limit index, key, state) to apply on commit
    inserted: list[tuple[int, bytes]] | None = None  # keys this request created (undone by ``discard``)


def leak(excess: int, last: int, now: int, rate_m: int) -> tuple[int, int]:
    """nginx's update of one node: the new excess (before +1000 clamping) and ``ms``."""
    ms = now - last
    if ms < -60000:
        ms = 1
    elif ms < 0:
        ms = 0
    value = excess - rate_m * ms // 1000 + 1000
    return (value if value > 0 else 0), ms


def delay_of(excess: int, params: ReqParams) -> int:
    if excess <= params.delay_m:
        return 0
    return (excess - params.delay_m) * 1000 // params.rate_m


def decide(
    limits: Sequence[ReqParams],
    tables: Sequence[ReqTable],
    keys: Sequence[bytes],
    now: int,
) -> ReqDecision:
    """Evaluate a location's ``limit_req`` list for one request.

    State changes are returned in ``writes`` (plus the ban of a BUSY key, already
    written) so that a caller combining this with other limits can still drop
    them; ``commit`` applies them. Bans and LRU touches happen immediately.
    """
    n = len(limits)
    excesses: list[int | None] = [None] * n
    writes: list[tuple[int, bytes, int]] = []
    pending: list[int] = []
    inserted: list[tuple[int, bytes]] = []
    rc = DECLINED
    excess = 0
    index = n - 1
    for i in range(n):
        key = keys[i]
        if not key or len(key) > MAX_KEY:
            continue
        index = i
        params = limits[i]
        table = tables[i]
        is_last = i == n - 1
        state = table.get(key)
        if state is not None:
            old_excess, last, ban_until = unpack(state)
            if ban_until:
                if ban_until > now:
                    return ReqDecision(FORBIDDEN, i, old_excess, 0, excesses, ban_until=ban_until)
                table.delete(key)  # the ban has run out: the key starts afresh
                state = None
        if state is not None:
            excess, ms = leak(old_excess, last, now, params.rate_m)
            if excess > params.burst_m:
                decision = ReqDecision(BUSY, i, excess, 0, excesses)
                if params.ban_ms:
                    decision.ban_until = now + params.ban_ms
                    decision.new_ban = True
                    table.put(key, pack(excess, now, decision.ban_until))
                return decision
            excesses[i] = excess
            if is_last:
                writes.append((i, key, pack(excess, now if ms else last)))
                rc = OK
                break
            pending.append(i)
            rc = AGAIN
            continue
        if not table.insert(key, pack(0, now if is_last else 0), now):
            return ReqDecision(ERROR, i, 0, 0, excesses)
        inserted.append((i, key))
        excesses[i] = 0
        if is_last:
            rc = OK
            excess = 0
            break
        pending.append(i)
        rc = AGAIN
    if rc == DECLINED:
        return ReqDecision(DECLINED, -1, 0, 0, excesses)
    if rc == AGAIN:
        excess = 0
        index = n - 1
    max_delay = delay_of(excess, limits[index])
    for j in reversed(pending):
        key = keys[j]
        state = tables[j].peek(key)
        old_excess, last, _ = unpack(state) if state is not None else (0, 0, 0)
        e, ms = leak(old_excess, last, now, limits[j].rate_m)
        writes.append((j, key, pack(e, now if ms else last)))
        excesses[j] = e
        d = delay_of(e, limits[j])
        if d > max_delay:
            max_delay = d
            excess = e
            index = j
    return ReqDecision(OK, index, excess, max_delay, excesses, writes=writes, inserted=inserted)


def commit(decision: ReqDecision, tables: Sequence[ReqTable]) -> None:
    for i, key, state in decision.writes or ():
        tables[i].put(key, state)


def discard(decision: ReqDecision, tables: Sequence[ReqTable]) -> None:
    """Another kind of limit rejected the request: leave no trace of this one."""
    for i, key in decision.inserted or ():
        tables[i].delete(key)


def expirable(state: int, now: int, rate_m: int) -> bool:
    """nginx's expiry test for the LRU tail: idle for 60 s and fully drained (and not banned)."""
    excess, last, ban_until = unpack(state)
    if ban_until > now:
        return False
    ms = abs(now - last)
    if ms < 60000:
        return False
    return excess - rate_m * ms // 1000 <= 0
