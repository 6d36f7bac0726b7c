"""What the status page shows about the last minutes: per-zone outcomes and the most limited keys.

* Per zone, the requests each zone passed, delayed and rejected, counted in fixed wall-clock
  buckets (``BUCKET_S`` seconds, the last ``BUCKETS`` of them) in a ring: recording is an index,
  a compare and an increment, with nothing allocated. Dry-run zones count what the client got
  (passed); a request a zone rejected is not counted as passed by the route's other zones.
* The rejected keys: per zone at most ``MAX_KEYS`` entries of (count, last seen, client). When a
  zone's table is full, the half with the lowest counts (and what has not been seen for the
  whole window) is dropped at once, so a flood of distinct keys costs O(log n) per key amortised
  and the memory stays bounded.

* Per route, in the same buckets: the responses, those that tell the app is failing (a 5xx
  that came from, or for want of, the upstream: not a limit's or a ban's refusal), and the
  upstream response time (sum and count, in ms): "is the app failing, or are we limiting?"
  is then the routes' 5xx beside the zones' rejections.

A zone or route quiet for the whole window (or removed by a reload) is dropped at the next snapshot.

Wall-clock buckets make the state of several worker processes mergeable: ``snapshot()`` is plain
JSON, and ``merge()`` sums snapshots bucket by bucket (the master serves the page, the workers
count). Keys are kept as the bytes the zone used and turned into text only in ``snapshot()``:
a 4- or 16-byte ``$binary_remote_addr`` becomes the address, a ``max_key``-hashed key becomes
``hashed:<hex>``, anything else is decoded with its undecodable bytes escaped.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.clock import epoch_ms
from gateway.http.keys import HASHED_MARK

if TYPE_CHECKING:
    from gateway.plan.compiled import RoutePlan

BUCKET_S = 10
BUCKETS = 60  # ten minutes
MAX_KEYS = 512  # rejected keys remembered per zone
TOP_KEYS = 25  # listed by the snapshot
PASSED, DELAYED, REJECTED = 0, 1, 2
OUTCOMES = ("passed", "delayed", "rejected")


class ZoneSeries:
    """The ring of one zone: ``counts[3 * slot + outcome]``, ``stamps[slot]`` = the bucket it holds."""

    __slots__ = ("counts", "stamps")

    def __init__(self) -> None:
        self.counts = [0] * (3 * BUCKETS)
        self.stamps = [-1] * BUCKETS

    def add(self, bucket: int, outcome: int) -> None:
        slot = bucket % BUCKETS
        at = 3 * slot
        if self.stamps[slot] != bucket:
            self.stamps[slot] = bucket
            self.counts[at] = self.counts[at + 1] = self.counts[at + 2] = 0
        self.counts[at + outcome] += 1

    def series(self, end: int) -> dict[str, list[int]]:
        """The buckets ``end - BUCKETS + 1 .. end``, oldest first, per outcome."""
        out: dict[str, list[int]] = {name: [0] * BUCKETS for name in OUTCOMES}
        for i in range(BUCKETS):
            bucket = end - BUCKETS + 1 + i
            slot = bucket % BUCKETS
            if self.stamps[slot] == bucket:
                for outcome, name in enumerate(OUTCOMES):
                    out[name][i] = self.counts[3 * slot + outcome]
        return out


ROUTE_FIELDS = ("requests", "app_5xx", "upstream_n", "upstream_ms")


class RouteSeries:
    """The ring of one route: ``counts[4 * slot + field]`` (``ROUTE_FIELDS``), ``stamps[slot]``."""

    __slots__ = ("counts", "stamps")

    def __init__(self) -> None:
        self.counts = [0] * (4 * BUCKETS)
        self.stamps = [-1] * BUCKETS

    def add(self, bucket: int, app_error: bool, upstream_ms: int | None) -> None:
        slot = bucket % BUCKETS
        at = 4 * slot
        counts = self.counts
        if self.stamps[slot] != bucket:
            self.stamps[slot] = bucket
            counts[at] = counts[at + 1] = counts[at + 2] = counts[at + 3] = 0
        counts[at] += 1
        if app_error:
            counts[at + 1] += 1
        if upstream_ms is not None:
            counts[at + 2] += 1
            counts[at + 3] += upstream_ms

    def series(self, end: int) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {name: [0] * BUCKETS for name in ROUTE_FIELDS}
        for i in range(BUCKETS):
            bucket = end - BUCKETS + 1 + i
            slot = bucket % BUCKETS
            if self.stamps[slot] == bucket:
                for field, name in enumerate(ROUTE_FIELDS):
                    out[name][i] = self.counts[4 * slot + field]
        return out


class KeyEntry:
    __slots__ = ("client", "count", "last")

    def __init__(self, client: object, now: float) -> None:
        self.count = 0
        self.last = now
        self.client = client  # the realip ClientAddr (its text is the ban target)


class Activity:
    """The counts of one process."""

    def __init__(self, clock: Any = time.time) -> None:
        self.clock = clock
        self.zones: dict[str, ZoneSeries] = {}
        self.keys: dict[str, dict[bytes, KeyEntry]] = {}
        self.routes: dict[str, RouteSeries] = {}

    def _series(self, zone: str) -> ZoneSeries:
        series = self.zones.get(zone)
        if series is None:
            series = self.zones[zone] = ZoneSeries()
        return series

    # -- the request path ------------------------------------------------------------------------
    def record(self, zone: str, outcome: int) -> None:
        self._series(zone).add(int(self.clock()) // BUCKET_S, outcome)

    def response(self, route: str, status: int, upstream_addr: str, upstream_time: str) -> None:
        """One response of ``route`` (its label; "" when none matched), as the access log sees it.

        It tells the app is failing when it is a 5xx and an upstream was tried (``upstream_addr``),
        or none was live (502, 504): a limit's or a ban's refusal never reaches an upstream."""
        series = self.routes.get(route)
        if series is None:
            series = self.routes[route] = RouteSeries()
        upstream_ms: int | None = None
        if upstream_time:
            try:
                upstream_ms = round(float(upstream_time.rpartition(", ")[2]) * 1000)
            except ValueError:
                upstream_ms = None
        app_error = status >= 500 and (bool(upstream_addr) or status in (502, 504))
        series.add(int(self.clock()) // BUCKET_S, app_error, upstream_ms)

    def reject(self, zone: str, key: bytes, client: object) -> None:
        now = self.clock()
        self._series(zone).add(int(now) // BUCKET_S, REJECTED)
        table = self.keys.get(zone)
        if table is None:
            table = self.keys[zone] = {}
        entry = table.get(key)
        if entry is None:
            if len(table) >= MAX_KEYS:
                _shrink(table, now)
            entry = table[key] = KeyEntry(client, now)
        entry.count += 1
        entry.last = now
        entry.client = client

    def decided(
        self,
        route: RoutePlan,
        rejected_by: tuple[str, bytes] | None,
        delaying: str,
        req_keys: Sequence[bytes],
        count_keys: Sequence[bytes],
        conn_keys: Sequence[bytes],
        algo: Sequence[tuple[bytes, int]],
        client: object,
    ) -> None:
        """One request's outcome in each zone of its route that applied (its key was not empty),
        as ``Limiter.admit`` decided it: ``rejected_by`` the zone that refused it and its key
        there; else ``delaying`` the zone whose delay it waits out ("" for none)."""
        if rejected_by is not None:
            self.reject(rejected_by[0], rejected_by[1], client)
            return
        bucket = int(self.clock()) // BUCKET_S
        if route.limit_req:
            for req_limit, key in zip(route.limit_req, req_keys, strict=False):
                if key:
                    self._series(req_limit.zone).add(bucket, DELAYED if req_limit.zone == delaying else PASSED)
        if route.limit_count:
            for count_limit, key in zip(route.limit_count, count_keys, strict=False):
                if key:
                    self._series(count_limit.zone).add(bucket, PASSED)
        if route.limit_conn:
            for conn_limit, key in zip(route.limit_conn, conn_keys, strict=False):
                if key:
                    self._series(conn_limit.zone).add(bucket, PASSED)
        if route.limit_algo:
            for algo_limit, (key, _) in zip(route.limit_algo, algo, strict=False):
                if key:
                    self._series(algo_limit.zone).add(bucket, DELAYED if algo_limit.zone == delaying else PASSED)

    # -- the admin side --------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """This process's counts as JSON-able data (the unit ``merge`` adds up)."""
        now = self.clock()
        end = int(now) // BUCKET_S
        since = now - BUCKET_S * BUCKETS
        zones = {name: series.series(end) for name, series in self.zones.items()}
        for name in [name for name, series in zones.items() if not any(map(any, series.values()))]:
            del zones[name], self.zones[name]  # quiet for the whole window (or gone with a reload)
            self.keys.pop(name, None)
        routes = {name: series.series(end) for name, series in self.routes.items()}
        for name in [name for name, series in routes.items() if not any(series["requests"])]:
            del routes[name], self.routes[name]
        keys: list[dict[str, Any]] = []
        for zone, table in self.keys.items():
            recent = [(key, e) for key, e in table.items() if e.last > since]
            recent.sort(key=lambda item: item[1].count, reverse=True)
            for key, entry in recent[:TOP_KEYS]:
                keys.append(
                    {
                        "zone": zone,
                        "key": key_text(key),
                        "client": str(getattr(entry.client, "text", "") or ""),
                        "count": entry.count,
                        "last_ms": int(entry.last * 1000),
                    }
                )
        return {"bucket_s": BUCKET_S, "end_bucket": end, "zones": zones, "routes": routes, "top_keys": _top(keys)}


def _shrink(table: dict[bytes, KeyEntry], now: float) -> None:
    """Keep the half of a full table with the highest counts among those seen within the window."""
    since = now - BUCKET_S * BUCKETS
    ranked = sorted(table.items(), key=lambda item: item[1].count if item[1].last > since else -1, reverse=True)
    table.clear()
    for key, entry in ranked[: MAX_KEYS // 2]:
        if entry.last > since:
            table[key] = entry


def key_text(key: bytes) -> str:
    if key[:1] == HASHED_MARK and len(key) == 17:
        return "hashed:" + key[1:].hex()
    if len(key) in (4, 16) and not (key.isascii() and key.decode("ascii").isprintable()):
        return str(ipaddress.ip_address(key))
    return key.decode("utf-8", "backslashreplace")


def _top(keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys.sort(key=lambda k: (-k["count"], -k["last_ms"]))
    return keys[:TOP_KEYS]


# -- the node's view: upstream health and the Redis circuit of a process ------------------------


def upstream_health(pools: Mapping[str, Any], now_ms: int) -> dict[str, list[dict[str, Any]]]:
    """Passive health per server, as the balancer of this process sees it."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, pool in pools.items():
        balancer = pool.balancer
        single = balancer.primary.single
        rows = []
        for peer in balancer.peers:
            failed = (
                not single
                and peer.max_fails > 0
                and peer.fails >= peer.max_fails
                and now_ms - peer.checked <= peer.fail_timeout_ms
            )
            rows.append(
                {
                    "server": peer.address,
                    "up": not (peer.down or failed),
                    "down": peer.down,
                    "backup": peer.spec.backup,
                    "fails": peer.fails,
                    "max_fails": peer.max_fails,
                    "weight": peer.weight,
                }
            )
        out[name] = rows
    return out


def redis_circuit(store: Any) -> str | None:
    """ "open" or "closed" for a Redis store (None without Redis)."""
    if store is None:
        return None
    state: str | None = store.status().get("redis_circuit")
    return state


def process_snapshot(activity: Activity, pools: Mapping[str, Any], store: Any, now_ms: int) -> dict[str, Any]:
    """What one serving process reports: its counts, its balancers' health, its Redis circuit."""
    snap = activity.snapshot()
    snap["upstreams"] = upstream_health(pools, now_ms)
    snap["redis_circuit"] = redis_circuit(store)
    return snap


def merge(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Several processes' snapshots as one: buckets summed (aligned on the newest), top keys summed
    per (zone, key), a server up only if every process sees it up, the circuit open if any is."""
    snaps = list(snapshots)
    end = max((s["end_bucket"] for s in snaps), default=int(time.time()) // BUCKET_S)
    zones: dict[str, dict[str, list[int]]] = {}
    routes: dict[str, dict[str, list[int]]] = {}
    keys: dict[tuple[str, str], dict[str, Any]] = {}
    upstreams: dict[str, dict[str, dict[str, Any]]] = {}
    circuits: list[str] = []
    for snap in snaps:
        shift = end - snap["end_bucket"]
        for name, series in snap["zones"].items():
            into = zones.setdefault(name, {o: [0] * BUCKETS for o in OUTCOMES})
            for outcome in OUTCOMES:
                values = series[outcome]
                for i in range(shift, BUCKETS):
                    into[outcome][i - shift] += values[i]
        for name, series in snap.get("routes", {}).items():
            into = routes.setdefault(name, {f: [0] * BUCKETS for f in ROUTE_FIELDS})
            for field in ROUTE_FIELDS:
                values = series[field]
                for i in range(shift, BUCKETS):
                    into[field][i - shift] += values[i]
        for item in snap["top_keys"]:
            known = keys.get((item["zone"], item["key"]))
            if known is None:
                keys[(item["zone"], item["key"])] = dict(item)
            else:
                known["count"] += item["count"]
                if item["last_ms"] > known["last_ms"]:
                    known["last_ms"], known["client"] = item["last_ms"], item["client"]
        for name, rows in snap.get("upstreams", {}).items():
            group = upstreams.setdefault(name, {})
            for row in rows:
                seen = group.get(row["server"])
                if seen is None:
                    group[row["server"]] = dict(row)
                else:
                    seen["up"] = seen["up"] and row["up"]
                    seen["fails"] = max(seen["fails"], row["fails"])
        if snap.get("redis_circuit"):
            circuits.append(snap["redis_circuit"])
    circuit = None if not circuits else ("open" if "open" in circuits else "closed")
    return {
        "bucket_s": BUCKET_S,
        "end_bucket": end,
        "zones": zones,
        "routes": routes,
        "top_keys": _top(list(keys.values())),
        "upstreams": {name: list(group.values()) for name, group in upstreams.items()},
        "redis_circuit": circuit,
    }


# -- the configuration in force ------------------------------------------------------------------


class ConfigInfo:
    """The config file's hash, when it was loaded (start) and last reloaded, and the reloads by
    result: what the status page and the ``gateway_config_*`` metrics show."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.hash = file_hash(path)
        self.loaded_ms = epoch_ms()
        self.in_force_ms = self.loaded_ms  # when the configuration in force was loaded
        self.reloaded_ms: int | None = None
        self.results = {"success": 0, "failure": 0}
        self.last_reload_ok: bool | None = None

    @property
    def reloads(self) -> int:
        return self.results["success"]

    def reloaded(self, ok: bool) -> None:
        """Count a reload (reads the file on success: call it off the serving loop)."""
        self.reloaded_ms = epoch_ms()
        self.last_reload_ok = ok
        self.results["success" if ok else "failure"] += 1
        if ok:
            self.in_force_ms = self.reloaded_ms
            self.hash = file_hash(self.path)

    def view(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "hash": self.hash,
            "loaded_ms": self.loaded_ms,
            "reloaded_ms": self.reloaded_ms,
            "reloads": self.reloads,
            "last_reload_ok": self.last_reload_ok,
        }


def file_hash(path: str) -> str:
    """The first 16 hex digits of the SHA-256 of the file's bytes ("" when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()[:16]
    except OSError:
        return ""


def worker_snapshots(items: Sequence[Any]) -> list[dict[str, Any]]:
    """The stats channel's merge for the status page: keep every worker's snapshot as it is
    (``merge`` adds them up when the page asks); a retired worker leaves nothing behind."""
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, dict):
            out.append(item)
        elif isinstance(item, list):
            out.extend(snap for snap in item if isinstance(snap, dict))
    return out


def retire_snapshot(_: Any) -> None:
    """A worker that is gone no longer counts on the page (its rates would freeze)."""
    return None
