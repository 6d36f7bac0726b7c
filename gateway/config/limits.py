"""A route's uses of zones: the ``limit_req``, ``limit_count`` and ``limit_conn`` lists (nginx's
directives, one zone type each) and the generic ``limits:`` list (any zone type, with its
per-use parameters). Which keys each type takes there is ``zones.LIMIT_USE_KEYS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config.reader import Reader, as_bool, as_str, int_in
from gateway.config.zones import LIMIT_USE_KEYS, MAX_BURST, ZoneSpec, ZoneType, is_refused, parse_cost
from gateway.errors import KeyPath
from gateway.http.keys import KeyTemplate


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitReqSpec:
    zone: str
    burst: int = 0
    delay: int = 0
    nodelay: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitCountSpec:
    zone: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitConnSpec:
    zone: str
    max: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitUseSpec:
    """One entry of a route's generic ``limits:`` list (any zone type, its per-use parameters)."""

    zone: str
    type: ZoneType
    burst: int = 0  # req
    delay: int = 0  # req
    nodelay: bool = False  # req
    max: int = 0  # conn
    cost: int | None = None  # gcra: overrides the zone's cost
    cost_var: KeyTemplate | None = None


def _zone_ref(
    r: Reader, data: dict[str, Any], path: KeyPath, zones: Mapping[str, ZoneSpec], kind: str, seen: set[str]
) -> str | None:
    name = r.field(data, "zone", path, as_str)
    if name is None:
        return None
    zone = zones.get(name)
    if zone is None:
        if not is_refused(zones, name):
            r.error(path + ("zone",), f'unknown zone "{name}"')
        return None
    if zone.type != kind:
        r.error(path + ("zone",), f'zone "{name}" is a {zone.type} zone, not a {kind} zone')
        return None
    if name in seen:
        r.error(
            path + ("zone",), f'zone "{name}" is used twice in one list (nginx: "limit_{kind}" directive is duplicate)'
        )
        return None
    seen.add(name)
    return name


def parse_limit_req(r: Reader, value: Any, path: KeyPath, zones: Mapping[str, ZoneSpec]) -> tuple[LimitReqSpec, ...]:
    out: list[LimitReqSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(r.sequence(value, path)):
        ipath = path + (i,)
        data = r.mapping(item, ipath, ("zone", "burst", "delay", "nodelay"), required=("zone",))
        if data is None:
            continue
        name = _zone_ref(r, data, ipath, zones, "req", seen)
        burst = r.field(data, "burst", ipath, _positive("burst"), 0)
        delay = r.field(data, "delay", ipath, _positive("delay"), 0)
        nodelay = r.field(data, "nodelay", ipath, as_bool, False)
        if nodelay and "delay" in data:
            r.error(ipath, "use either nodelay or delay, not both")
        if name is not None and burst is not None and delay is not None:
            out.append(LimitReqSpec(zone=name, burst=burst, delay=delay, nodelay=bool(nodelay)))
    return tuple(out)


def _positive(what: str) -> Any:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f'invalid {what} value "{value}": must be an integer greater than zero (omit it for 0)')
        if value > MAX_BURST:
            raise ValueError(f"invalid {what} value {value}: at most {MAX_BURST}")
        return value

    return parse


def parse_limit_count(
    r: Reader, value: Any, path: KeyPath, zones: Mapping[str, ZoneSpec]
) -> tuple[LimitCountSpec, ...]:
    out: list[LimitCountSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(r.sequence(value, path)):
        data = r.mapping(item, path + (i,), ("zone",), required=("zone",))
        if data is None:
            continue
        name = _zone_ref(r, data, path + (i,), zones, "count", seen)
        if name is not None:
            out.append(LimitCountSpec(zone=name))
    return tuple(out)


def parse_limit_conn(r: Reader, value: Any, path: KeyPath, zones: Mapping[str, ZoneSpec]) -> tuple[LimitConnSpec, ...]:
    out: list[LimitConnSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(r.sequence(value, path)):
        ipath = path + (i,)
        data = r.mapping(item, ipath, ("zone", "max"), required=("zone", "max"))
        if data is None:
            continue
        name = _zone_ref(r, data, ipath, zones, "conn", seen)
        limit = r.field(data, "max", ipath, int_in(1, 65535, "number of connections"))
        if name is not None and limit is not None:
            out.append(LimitConnSpec(zone=name, max=limit))
    return tuple(out)


def no_zone_twice(r: Reader, data: dict[str, Any], path: KeyPath) -> None:
    """A zone in ``limits:`` and in a ``limit_*`` list of the same route would be charged twice."""
    named = set()
    for kind in ("limit_req", "limit_count", "limit_conn"):
        items = data.get(kind)
        for item in items if isinstance(items, list) else ():  # not a list: its own parser says so
            if isinstance(item, dict) and isinstance(item.get("zone"), str):
                named.add(item["zone"])
    limits = data["limits"]
    for i, item in enumerate(limits if isinstance(limits, list) else ()):
        if isinstance(item, dict) and isinstance(item.get("zone"), str) and item["zone"] in named:
            r.error(path + ("limits", i, "zone"), f'zone "{item["zone"]}" is also in a limit_* list of this route')


def parse_limits(r: Reader, value: Any, path: KeyPath, zones: Mapping[str, ZoneSpec]) -> tuple[LimitUseSpec, ...]:
    """The generic ordered list: ``[{zone: name, ...its per-use parameters}]``, any zone type."""
    out: list[LimitUseSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(r.sequence(value, path)):
        ipath = path + (i,)
        if not isinstance(item, dict) or not isinstance(item.get("zone"), str):
            r.error(ipath, "expected a mapping with a zone and its per-use parameters")
            continue
        zone = zones.get(item["zone"])
        if zone is None:
            if not is_refused(zones, item["zone"]):
                r.error(ipath + ("zone",), f'unknown zone "{item["zone"]}"')
            continue
        required = ("zone", "max") if zone.type == "conn" else ("zone",)
        data = r.mapping(item, ipath, LIMIT_USE_KEYS[zone.type], required=required)
        if data is None:
            continue
        name = _zone_ref(r, data, ipath, zones, zone.type, seen)
        burst = r.field(data, "burst", ipath, _positive("burst"), 0)
        delay = r.field(data, "delay", ipath, _positive("delay"), 0)
        nodelay = r.field(data, "nodelay", ipath, as_bool, False)
        if nodelay and "delay" in data:
            r.error(ipath, "use either nodelay or delay, not both")
        limit = r.field(data, "max", ipath, int_in(1, 65535, "number of connections"), 0)
        cost = r.field(data, "cost", ipath, lambda v: parse_cost(v, r.defined), {})
        if name is None or burst is None or delay is None or limit is None or cost is None:
            continue
        out.append(
            LimitUseSpec(zone=name, type=zone.type, burst=burst, delay=delay, nodelay=bool(nodelay), max=limit, **cost)
        )
    return tuple(out)
