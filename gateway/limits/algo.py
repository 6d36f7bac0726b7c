"""The record of one zone type of the newer algorithms (``limits:``): everything the engines need.

A zone type's module (``gcra.py``, ``sliding_log.py``, ``token.py``) holds its pure decision
and ends with ``ZONE_TYPE = AlgoType(...)``: its parameters, how a zone spec makes them, its
decision in the shape every store answers (``AlgoOutcome``), its state's expiry and memory
charge, its Redis script's arguments and undo, its RateLimit-Policy item and its inspect
views. ``gateway.limits.registry`` finds those records; the plan binds a route's limit to its
record once, at compile time, and the stores call the record instead of branching on the
type's name.

The functions take the type's parameter record first (``params``: a frozen dataclass of ints
and floats, sent field by field between a worker and its master), so one record serves
every zone of the type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from gateway.limits.outcome import AlgoOutcome

if TYPE_CHECKING:
    from gateway.config.zones import ZoneSpec


def same_cost(params: Any, cost: int) -> int:
    """The cost as asked: types whose arithmetic takes any quantity."""
    return cost


def no_quota(params: Any) -> int | None:
    """The script answers the quota itself."""
    return None


def no_extra_bytes(params: Any) -> int:
    """A key's state costs no more than the store's fixed charge per key."""
    return 0


def text_of(value: Any) -> str:
    """A Redis reply field as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


async def string_view(client: Any, key: bytes, params: Any, now_ms: int) -> dict[str, Any] | None:
    """The Redis view of a state stored as a string: shown as stored, with its TTL."""
    raw, ttl = await asyncio.gather(client.get(key), client.pttl(key))
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return {"state": text, "ttl_ms": max(0, int(ttl))}


@dataclass(frozen=True, slots=True)
class AlgoType:
    """One zone type of ``limits:``. Times are ms of the store's clock unless named otherwise."""

    name: str  # the zone's ``type:`` in the config, and $limit_<name>_status
    code: int  # its type code in request.lua's arguments (scripts/lua/request.lua), unique
    script: str  # its Lua file in scripts/lua/, which defines <name>_algo_peek / _commit (/ _undo)
    params: type  # its parameter record (a frozen dataclass)
    params_of: Callable[[ZoneSpec], Any]  # the zone's parameters, from its validated spec
    # (params, state or None, now_ms, cost) -> the answer, and the state to store if it goes on
    decide: Callable[[Any, Any, int, int], tuple[AlgoOutcome, Any]]
    expired: Callable[[Any, Any, int], bool]  # (params, state, now_ms): the same as no state
    policy: Callable[[str, Any], str]  # (zone, params) -> its RateLimit-Policy item
    lua_args: Callable[[Any], list[Any]]  # request.lua's three numbers for the zone
    undo: Callable[[Any, int, int, list[Any]], str]  # (params, cost, now_ms, reply fields) -> undo.lua kind
    view: Callable[[Any, Any, int], dict[str, Any]]  # (params, state, now_ms) -> the embedded store's view
    redis_view: Callable[[Any, bytes, Any, int], Awaitable[dict[str, Any] | None]] = string_view
    undo_tag: str = ""  # the letter of its undo kinds when its script defines <name>_algo_undo
    tagged: bool = True  # its Redis key carries the count keys' hash tag on a cluster
    clamp: Callable[[Any, int], int] = same_cost  # the cost sent to Redis
    quota: Callable[[Any], int | None] = no_quota  # the policy quota, when its script answers 0
    extra_bytes: Callable[[Any], int] = no_extra_bytes  # a key's memory charge beyond the fixed one

    @property
    def field_names(self) -> tuple[str, ...]:
        """The parameter record's fields, in order (what crosses the shared store's wire)."""
        return tuple(f.name for f in fields(self.params))
