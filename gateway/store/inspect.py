"""One key's limit state in a zone, to see or reset it: ``GET``/``DELETE /zones/<zone>/<key>``.

This module reads the embedded store (``MemoryStore``: the single process's, or the
master's with ``workers: N``); ``redis/inspect.py`` reads Redis. A zone type of ``limits:``
brings its own views (``gateway.limits.algo``). Both answer the
same shape: ``{"zone", "type", "key", ...the state}``, or None when the key has no state.

Times are reported relative to now (``*_in_ms``: how long until; ``*_ago_ms``: how
long since), since the embedded store keeps a monotonic clock.
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.config.zones import ZoneSpec
from gateway.http.keys import key_from_text
from gateway.limits import count as count_logic
from gateway.limits import nginx_req, sliding_count
from gateway.store.memory import ENTRY_COST, AlgoZone, ConnZone, MemoryStore


class UnknownZone(LookupError):
    pass


class ZoneState(Protocol):
    async def show(self, zone: str, text: str) -> dict[str, Any] | None: ...

    async def reset(self, zone: str, text: str) -> bool: ...


def store_key(spec: ZoneSpec, text: str) -> bytes:
    """The stored key of ``text`` in this zone; ValueError when it cannot be one."""
    return key_from_text(spec.key, text, max_key=spec.max_key, ipv6_prefix=spec.ipv6_prefix)


class MemoryZoneState:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def _zone(self, name: str) -> Any:
        zone = self.store.zones.get(name)
        if zone is None:
            raise UnknownZone(name)
        return zone

    async def show(self, zone: str, text: str) -> dict[str, Any] | None:
        table = self._zone(zone)
        key = store_key(table.spec, text)
        state = table.counts.get(key) if isinstance(table, ConnZone) else table.lookup(key)  # no LRU touch
        if state is None:
            return None
        view = {"zone": zone, "type": table.spec.type, "key": text}
        view.update(describe(table, state, self.store.clock_ms()))
        return view

    async def reset(self, zone: str, text: str) -> bool:
        table = self._zone(zone)
        key = store_key(table.spec, text)
        if isinstance(table, ConnZone):
            if key not in table.counts:
                return False
            del table.counts[key]  # the requests holding it release nothing (ConnZone.release)
            table.used -= ENTRY_COST + len(key)
            return True
        if key not in table:
            return False
        table._drop(key)
        return True


def describe(table: Any, state: Any, now: int) -> dict[str, Any]:
    if isinstance(table, AlgoZone):  # a type of limits: shows itself (gateway.limits.registry)
        return table.algo.view(table.params, state, now)
    spec: ZoneSpec = table.spec
    kind = spec.type
    if kind == "conn":
        return {"active": int(state)}
    if kind == "req":
        excess, last, ban_until = nginx_req.unpack(state)
        assert spec.rate is not None
        leaked = max(0, excess - spec.rate.rate_m * max(0, now - last) // 1000)
        view: dict[str, Any] = {"excess": leaked / 1000, "last_ago_ms": max(0, now - last)}
        view["banned_for_ms"] = max(0, ban_until - now) if ban_until > now else 0
        return view
    if kind == "count" and spec.window_type == "sliding":
        _, current, previous = sliding_count.counts(state, now, spec.window_ms)
        weight = 1 - (now % spec.window_ms) / spec.window_ms
        used = current + previous * weight
        return {"current": current, "previous": previous, "remaining": max(0, int(spec.limit - used))}
    if kind == "count":
        used, window_end = count_logic.unpack(state)
        if window_end <= now:
            return {"remaining": spec.limit, "reset_in_ms": 0}
        return {"used": used, "remaining": max(0, spec.limit - used), "reset_in_ms": window_end - now}
    return {"state": repr(state)}
