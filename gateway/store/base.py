"""What every store does for the request path, and what it answers.

A store evaluates a route's limits for one request in one step:

1. ``limit_req`` (nginx semantics; bans);
2. ``limit_count`` - if a count zone rejects, the ``limit_req`` accounting of this
   request is dropped: a rejected request is charged nowhere;
3. the zones of the newer algorithms (``limits:`` entries of type gcra), in
   order: the first that rejects stops, and drops the charges of 1 and 2;
4. ``limit_conn`` - in the same step when the request will not be delayed;
   otherwise after the delay, through ``acquire_conn`` (so a waiting request
   holds no slot, as in nginx, where limit_req runs before limit_conn).

In dry run nothing is refused, and each kind accounts as if the others had let
the request through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.config.zones import ZoneSpec
from gateway.limits.conn import ConnDecision
from gateway.limits.nginx_req import ReqDecision
from gateway.limits.outcome import AlgoOutcome


class LimitSet(Protocol):
    """The limits of one route as a store sees them (a ``RoutePlan`` is one)."""

    @property
    def limit_req(self) -> Sequence[Any]: ...
    @property
    def limit_count(self) -> Sequence[Any]: ...
    @property
    def limit_conn(self) -> Sequence[Any]: ...
    @property
    def limit_algo(self) -> Sequence[Any]: ...
    @property
    def dry_run(self) -> bool: ...


@dataclass(slots=True)
class Verdict:
    now_ms: int
    req: ReqDecision | None = None  # None: the route has no limit_req
    count_rejected: int = -1  # index of the count limit that rejected
    count_used: list[int | None] = field(default_factory=list)
    count_reset_ms: list[int | None] = field(default_factory=list)
    conn: ConnDecision | None = None  # None: not acquired in this step
    algo_rejected: int = -1  # index of the limit_algo zone that rejected
    algo: list[AlgoOutcome | None] = field(default_factory=list)  # per limit_algo zone (None: no key)


AlgoUse = tuple[bytes, int]  # one limit_algo zone for one request: (key, cost)


BanSink = Callable[[list[Any], list[str], int], None]  # (bans added, targets removed, part)


class Store(Protocol):
    kind: str  # "memory", "shared" or "redis": what /status reports

    @property
    def on_error(self) -> str:
        """What a StoreUnavailable from this store means for the request: "allow" or "deny"
        ("local": the store falls back to its embedded state by itself, so it never raises)."""
        ...

    def configure(self, zones: Mapping[str, ZoneSpec]) -> None:
        """Create, keep or resize zones for a (re)loaded configuration."""
        ...

    async def start(self) -> None:
        """Connect (a store that cannot yet reach its backend applies ``on_error``, it does not fail)."""
        ...

    def status(self) -> dict[str, Any]:
        """What /status reports about the store, beyond its ``kind``."""
        ...

    def deliver_bans(self, sink: BanSink) -> bool:
        """Hand ban changes pushed through this store to ``sink``; False if it pushes none."""
        ...

    async def admit(
        self,
        route: LimitSet,
        req_keys: Sequence[bytes],
        count_keys: Sequence[bytes],
        conn_keys: Sequence[bytes],
        algo: Sequence[AlgoUse] = (),
    ) -> Verdict: ...

    async def acquire_conn(self, route: LimitSet, conn_keys: Sequence[bytes]) -> ConnDecision: ...

    def release(self, route: LimitSet, decision: ConnDecision) -> None:
        """Give back the slots of a finished request (never blocks, never raises)."""
        ...

    async def close(self) -> None: ...
