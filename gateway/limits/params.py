"""What every engine needs to know of a route's limits: the parameter records, declared once.

The embedded store decides with them, the worker-master protocol (gateway/store/shared.py)
sends them field by field, and the Redis store turns them into its scripts' arguments. A
route's plan (gateway/plan/compiled.py) extends each with what only the request path needs: the key
function, the metrics slots, the texts of its headers. ``RouteLimits`` is the set of one route,
as the master rebuilds it; a ``RoutePlan`` is one too (``gateway.store.base.LimitSet``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from gateway.limits.algo import AlgoType
from gateway.limits.registry import algo_type


@dataclass(frozen=True, slots=True)
class ReqParams:
    """One ``limit_req`` entry: its zone's rate, and the entry's burst and delay, in milli-units."""

    zone: str
    rate_m: int  # milli-requests per second, nginx-truncated
    burst_m: int
    delay_m: int  # NODELAY_M (gateway/plan/compiled.py) for nodelay
    ban_ms: int = 0


@dataclass(frozen=True, slots=True)
class CountParams:
    """One ``limit_count`` entry (a fixed window, or APISIX's sliding estimate)."""

    zone: str
    limit: int
    window_ms: int
    sliding: bool = False


@dataclass(frozen=True, slots=True)
class ConnParams:
    """One ``limit_conn`` entry."""

    zone: str
    max: int


@dataclass(frozen=True, slots=True)
class AlgoParams:
    """One zone of the newer algorithms (``limits:``): its type's parameter record, and the
    type's record itself (``algo``), looked up once here so that no store looks it up per request."""

    zone: str
    type: str
    params: Any  # the type's parameter record (``algo.params``)
    algo: AlgoType = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "algo", algo_type(self.type))


@dataclass(frozen=True, slots=True)
class RouteLimits:
    """The limits of one route."""

    limit_req: tuple[ReqParams, ...]
    limit_count: tuple[CountParams, ...]
    limit_conn: tuple[ConnParams, ...]
    dry_run: bool
    limit_algo: tuple[AlgoParams, ...] = ()


def field_names(record: type[Any]) -> tuple[str, ...]:
    """The fields a record of ``record``'s kind is made of, in order (the wire sends these)."""
    return tuple(f.name for f in fields(record))
