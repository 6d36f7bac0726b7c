"""``zones:``: the named rate and connection limits, each with a type, a key and the type's
parameters; and the tables of which keys each zone type takes, in ``zones:`` and in a route's
``limits:`` list.

A key with no variable gives every client one bucket. That is what a site-wide limit wants, and
what a forgotten ``$`` (``key: binary_remote_addr``) does by mistake: ``key: global`` says it is
meant (``GLOBAL_KEY``); any other key without a variable is kept as written, with a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.config.reader import Reader, duration_ms, int_in, one_of, positive_duration_ms, zone_size
from gateway.config.units import PeriodRate, Rate, parse_period_rate, parse_rate
from gateway.errors import KeyPath
from gateway.http.keys import (
    ADDRESS_VARIABLES,
    DEFAULT_MAX_KEY,
    MAX_MAX_KEY,
    MIN_MAX_KEY,
    NO_DEFINED,
    Defined,
    KeyTemplate,
    is_variable_name,
    parse_key,
)
from gateway.limits.gcra import MAX_SPAN_NS as GCRA_MAX_SPAN_NS
from gateway.limits.sliding_count import MAX_PRODUCT as SLIDING_MAX_PRODUCT

SLIDING_LOG_MAX = 100_000  # entries per key: the memory a key may cost stays bounded
ZoneType = Literal["req", "count", "conn", "gcra", "sliding_log", "token"]
ALGO_TYPES = ("gcra", "sliding_log", "token")  # zones used only through a route's limits: list
NGINX_MIN_ZONE = 32 * 1024
MAX_BURST = 2**31 - 1  # burst and delay: x1000 they stay exact in the 42 bits of excess
GLOBAL_KEY = "global"  # the key of a zone meant to have one bucket for every client


@dataclass(frozen=True, slots=True, kw_only=True)
class ZoneSpec:
    name: str
    type: ZoneType
    key: KeyTemplate
    size: int = 10 * 1024 * 1024
    rate: Rate | None = None  # req
    ban_s: int = 0  # req
    limit: int = 0  # count
    window_ms: int = 0  # count
    window_type: str = "fixed"  # count: fixed (resty.limit.count) or sliding (APISIX's estimate)
    period_rate: PeriodRate | None = None  # gcra
    burst: int = 0  # gcra (redis-cell's max_burst)
    cost: int = 1  # gcra: units per request, unless cost_var is set
    cost_var: KeyTemplate | None = None  # gcra: cost from a variable such as $http_x_cost
    warmup_ms: int = 0  # token: SmoothWarmingUp's warm-up period (0: SmoothBursty)
    max_delay_ms: int = 0  # token: the longest a request waits for its permit
    max_key: int = DEFAULT_MAX_KEY  # longer keys are hashed to a fixed size
    ipv6_prefix: int = 128  # IPv6 client addresses are masked to this prefix in the key


# Per zone type: the keys a zone may have (ZONE_KEYS) and must have (ZONE_REQUIRED) in zones:,
# and the keys one use of it may have in a route's limits: list (LIMIT_USE_KEYS).
ZONE_KEYS = {
    "req": ("type", "key", "rate", "ban", "size", "max_key", "ipv6_prefix"),
    "count": ("type", "key", "limit", "window", "window_type", "size", "max_key", "ipv6_prefix"),
    "conn": ("type", "key", "size", "max_key", "ipv6_prefix"),
    "gcra": ("type", "key", "rate", "burst", "cost", "size", "max_key", "ipv6_prefix"),
    "sliding_log": ("type", "key", "limit", "window", "size", "max_key", "ipv6_prefix"),
    "token": ("type", "key", "rate", "warmup", "max_delay", "size", "max_key", "ipv6_prefix"),
}
ZONE_REQUIRED = {
    "req": ("key", "rate"),
    "count": ("key", "limit", "window"),
    "conn": ("key",),
    "gcra": ("key", "rate"),
    "sliding_log": ("key", "limit", "window"),
    "token": ("key", "rate"),
}
LIMIT_USE_KEYS = {
    "req": ("zone", "burst", "delay", "nodelay"),
    "count": ("zone",),
    "conn": ("zone", "max"),
    "gcra": ("zone", "cost"),
    "sliding_log": ("zone",),
    "token": ("zone",),
}


class ZoneTable(dict[str, ZoneSpec]):
    """The zones that were built, and the names of those declared but refused: a route that
    uses a refused zone is not reported again ("unknown zone"): its root cause already was."""

    refused: frozenset[str] = frozenset()


def parse_zones(r: Reader, value: Any, path: KeyPath) -> ZoneTable:
    out = ZoneTable()
    if not isinstance(value, dict):
        r.error(path, "expected a mapping of zone names to zones")
        return out
    out.refused = frozenset(str(name) for name in value)  # until each is built
    for name, body in value.items():
        zpath = path + (name,)
        if not isinstance(body, dict):
            r.error(zpath, "expected a mapping with type, key and the zone's parameters")
            continue
        ztype = body.get("type")
        if not isinstance(ztype, str) or ztype not in ZONE_KEYS:
            r.error(
                zpath + ("type",) if "type" in body else zpath,
                f"zone type must be req, count, conn, gcra, sliding_log or token, got {ztype!r}"
                if "type" in body
                else "missing required key 'type' (req, count, conn, gcra, sliding_log or token)",
            )
            continue
        data = r.mapping(body, zpath, ZONE_KEYS[ztype], required=ZONE_REQUIRED[ztype])
        if data is None:
            continue
        key = r.field(data, "key", zpath, lambda v: parse_zone_key(v, r.defined))
        if key is not None and not key.variables and key.source != GLOBAL_KEY:
            r.warn(zpath + ("key",), constant_key_warning(key))
        zone_bytes = r.field(data, "size", zpath, zone_size, 10 * 1024 * 1024)
        if zone_bytes is not None and zone_bytes < NGINX_MIN_ZONE:
            r.error(zpath + ("size",), f'zone "{name}" is too small: at least 32k, like nginx')
        rate = r.field(data, "rate", zpath, parse_rate) if ztype == "req" else None
        ban_ms = r.field(data, "ban", zpath, duration_ms, 0) if ztype == "req" else 0
        if ban_ms and ban_ms % 1000:
            r.error(zpath + ("ban",), "ban is kept in whole seconds (it becomes a Redis EXPIRE)")
        counted = ztype in ("count", "sliding_log")
        log_max = SLIDING_LOG_MAX if ztype == "sliding_log" else 2**31 - 1
        limit = r.field(data, "limit", zpath, int_in(1, log_max, "limit")) if counted else 0
        window = r.field(data, "window", zpath, positive_duration_ms) if counted else 0
        max_key = r.field(data, "max_key", zpath, int_in(MIN_MAX_KEY, MAX_MAX_KEY, "max_key"), DEFAULT_MAX_KEY)
        ipv6_prefix = r.field(data, "ipv6_prefix", zpath, int_in(1, 128, "ipv6_prefix"), 128)
        if (
            ipv6_prefix != 128
            and key is not None
            and not set(key.variables) & {*ADDRESS_VARIABLES, *r.defined.addressed}
        ):
            r.error(
                zpath + ("ipv6_prefix",),
                "ipv6_prefix only changes $binary_remote_addr and $remote_addr, and the key uses neither",
            )
        if key is None or zone_bytes is None or max_key is None or ipv6_prefix is None:
            continue
        if ztype == "req" and rate is None:
            continue
        if counted and (limit is None or window is None):
            continue
        window_type = (
            r.field(data, "window_type", zpath, one_of("fixed", "sliding"), "fixed") if ztype == "count" else None
        )
        if window_type == "sliding" and (limit or 0) * (window or 0) > SLIDING_MAX_PRODUCT:
            r.error(zpath + ("window",), "limit x window (in ms) must stay under 2^53 for a sliding window")
            continue
        algo = _algo_zone(r, data, zpath, ztype)
        if algo is None:
            continue
        out[name] = ZoneSpec(
            name=name,
            type=ztype,  # type: ignore[arg-type]  # checked against ZONE_KEYS above
            key=key,
            size=zone_bytes,
            rate=rate,
            ban_s=(ban_ms or 0) // 1000,
            limit=limit or 0,
            window_ms=window or 0,
            window_type=window_type or "fixed",
            **algo,
            max_key=max_key,
            ipv6_prefix=ipv6_prefix,
        )
    out.refused = frozenset(name for name in out.refused if name not in out)
    return out


def constant_key_warning(key: KeyTemplate) -> str:
    """What ``gateway check`` says about a key with no variable other than ``global``."""
    text = key.source.strip()
    typo = text.lstrip("{").rstrip("}")
    hint = f'did you mean "${typo}"? ' if is_variable_name(typo) else ""
    return (
        f"key {key.source!r} has no variable, so every client shares one bucket; "
        f"{hint}write key: {GLOBAL_KEY} if one bucket for all is meant"
    )


def _algo_zone(r: Reader, data: dict[str, Any], zpath: KeyPath, ztype: str) -> dict[str, Any] | None:
    """The parameters of a gcra zone ({} for the other types; None when one is invalid)."""
    if ztype not in ALGO_TYPES or ztype == "sliding_log":
        return {}
    if ztype == "token":
        return _token_zone(r, data, zpath)
    rate = r.field(data, "rate", zpath, parse_period_rate)
    burst = r.field(data, "burst", zpath, int_in(0, MAX_BURST, "burst"), 0)
    cost = r.field(data, "cost", zpath, lambda v: parse_cost(v, r.defined), {"cost": 1})
    if rate is None or burst is None or cost is None:
        return None
    if rate.count > rate.period_s * 1_000_000:
        r.error(zpath + ("rate",), "a gcra rate is at most 1000000r/s (one request per microsecond)")
        return None
    if int(rate.period_s * 1e9 / rate.count) * (burst + 1) > GCRA_MAX_SPAN_NS:
        r.error(zpath + ("burst",), "burst + 1 requests at this rate span more than 104 days; lower burst")
        return None
    out: dict[str, Any] = {"period_rate": rate, "burst": burst}
    out.update(cost)
    return out


def _token_zone(r: Reader, data: dict[str, Any], zpath: KeyPath) -> dict[str, Any] | None:
    rate = r.field(data, "rate", zpath, parse_period_rate)
    warmup = r.field(data, "warmup", zpath, duration_ms, 0)
    max_delay = r.field(data, "max_delay", zpath, duration_ms, 0)
    if rate is None or warmup is None or max_delay is None:
        return None
    if rate.count > rate.period_s * 1_000_000:
        r.error(zpath + ("rate",), "a token rate is at most 1000000r/s")
        return None
    if warmup > 86_400_000 or max_delay > 3_600_000:
        r.error(zpath, "warmup is at most 1d and max_delay at most 1h")
        return None
    return {"period_rate": rate, "warmup_ms": warmup, "max_delay_ms": max_delay}


def parse_cost(value: Any, defined: Defined = NO_DEFINED) -> dict[str, Any]:
    """``cost``: a whole number of units (0 peeks), or a variable such as ``$http_x_cost``."""
    if isinstance(value, str) and value.startswith("$"):
        return {"cost_var": parse_key(value, defined)}
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BURST:
        raise ValueError(f"invalid cost {value!r}: a whole number from 0 to {MAX_BURST}, or a variable")
    return {"cost": value}


def is_refused(zones: Mapping[str, ZoneSpec], name: str) -> bool:
    """``name`` was declared in ``zones:`` but refused: its errors are already reported."""
    return isinstance(zones, ZoneTable) and name in zones.refused


def parse_zone_key(value: Any, defined: Defined = NO_DEFINED) -> KeyTemplate:
    """A zone's key: any key template but one that names ``$request_id``."""
    key = parse_key(value, defined)
    if "request_id" in key.variables:
        raise ValueError("$request_id is new for every request: a zone keyed by it never limits anything")
    return key
