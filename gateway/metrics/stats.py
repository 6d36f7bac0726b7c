"""The metrics of one process: plain counters on the request path, read at scrape time.

The request path never touches prometheus_client: it adds to ints in dicts and to the
bucket lists of ``Histogram`` (one ``bisect`` and two additions). ``snapshot()`` turns
everything into a JSON-able dict (it travels from a worker to the master as it is), and
``merge()`` adds snapshots of several processes together; ``gateway/metrics/render.py``
turns the result into Prometheus text.

Snapshot shape: ``{"c": {family: [[*labels, value]]}, "h": {family: [[*labels, counts, sum]]},
"g": {family: [[*labels, value]]}}`` -- counters, histograms (non-cumulative bucket counts,
``+Inf`` last) and gauges. Gauges are read from live objects (connections, bans, the Redis
circuit, upstream health) through sources registered with ``gauge()``.

gateway_limit_decisions_total{zone,kind,outcome}: one count per zone that evaluated the
request, like the ``$limit_*_status`` variables: a rejected or delayed request counts on the
zone that decided (``rejected``, ``delayed``, or their ``_dry_run`` forms), the other zones
of its kind that counted it as ``passed``; a request that a count zone rejects is not counted
by limit_req (nginx drops its accounting). ``banned``: a limit_req zone with ``ban`` refusing a
banned key (zone = that zone, kind = limit_req), or a manual ban (zone = "", kind = "ban").
kind is limit_req, limit_count, limit_conn, or limit_<type> for the newer algorithms.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# Bucket bounds (seconds), fixed per family so that snapshots of several processes add up.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
UPSTREAM_BUCKETS = REQUEST_BUCKETS
DELAY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REDIS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

BUCKETS: dict[str, tuple[float, ...]] = {
    "gateway_request_duration_seconds": REQUEST_BUCKETS,
    "gateway_upstream_duration_seconds": UPSTREAM_BUCKETS,
    "gateway_limit_delay_seconds": DELAY_BUCKETS,
    "gateway_redis_call_duration_seconds": REDIS_BUCKETS,
}

# How the gauges of several workers make the node's value.
GAUGE_MERGE: dict[str, Callable[[Iterable[float]], float]] = {
    "gateway_connections": sum,  # client connections of every worker
    "gateway_limit_conn_active": sum,  # limit_conn slots held by every worker's requests
    "gateway_bans_active": max,  # every worker holds the whole ban list
    "gateway_redis_circuit_open": max,  # 1 when any worker's circuit is open
    "gateway_upstream_server_up": min,  # 0 when any worker has taken the server out
    "gateway_upstream_server_connections": sum,  # requests of every worker holding the server
}

# outcome of gateway_limit_decisions_total: its index in a zone's slots
OUTCOMES = ("passed", "delayed", "rejected", "delayed_dry_run", "rejected_dry_run", "banned")
PASSED, DELAYED, REJECTED, DELAYED_DRY_RUN, REJECTED_DRY_RUN, BANNED = range(6)


def new_slots() -> list[int]:
    return [0] * len(OUTCOMES)


class Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Route:
    """One route's requests: per status, and how long they took."""

    __slots__ = ("duration", "statuses")

    def __init__(self) -> None:
        self.statuses: dict[int, int] = {}
        self.duration = Histogram(REQUEST_BUCKETS)


GaugeSource = Callable[[], Iterable[Sequence[Any]]]  # rows of [*labels, value]


class Stats:
    def __init__(self) -> None:
        self.routes: dict[str, _Route] = {}
        self.upstreams: dict[str, Histogram] = {}
        # (zone, kind) -> counts by outcome; the compiled plan holds these lists (``slots``)
        self.decisions: dict[tuple[str, str], list[int]] = {}
        self.delays: dict[str, Histogram] = {}
        self.redis_calls: dict[str, int] = {}
        self.redis_duration = Histogram(REDIS_BUCKETS)
        self.conn_active: dict[str, int] = {}  # limit_conn slots held by this process's requests
        self.gauges: dict[str, GaugeSource] = {}

    # -- the request path -----------------------------------------------------------------------
    def request(self, route: str, status: int, elapsed: float) -> None:
        slot = self.routes.get(route)
        if slot is None:
            slot = self.routes[route] = _Route()
        statuses = slot.statuses
        statuses[status] = statuses.get(status, 0) + 1
        histogram = slot.duration  # observe(), inlined: one call less on every request
        histogram.counts[bisect_left(REQUEST_BUCKETS, elapsed)] += 1
        histogram.sum += elapsed

    def upstream(self, name: str, elapsed: float) -> None:
        histogram = self.upstreams.get(name)
        if histogram is None:
            histogram = self.upstreams[name] = Histogram(UPSTREAM_BUCKETS)
        histogram.counts[bisect_left(UPSTREAM_BUCKETS, elapsed)] += 1
        histogram.sum += elapsed

    def slots(self, zone: str, kind: str) -> list[int]:
        """The decision counts of a zone, by outcome: compiled into the plan (a reload gets the same
        list back, so counts carry on), and added to on the request path with one ``+= 1``."""
        return self.decisions.setdefault((zone, kind), new_slots())

    def decision(self, zone: str, kind: str, outcome: int) -> None:
        self.slots(zone, kind)[outcome] += 1

    def delay(self, zone: str, seconds: float) -> None:
        histogram = self.delays.get(zone)
        if histogram is None:
            histogram = self.delays[zone] = Histogram(DELAY_BUCKETS)
        histogram.observe(seconds)

    def redis_call(self, outcome: str, seconds: float) -> None:
        """One Redis call of the request path ended (ok, error, timeout, circuit_open)."""
        self.redis_calls[outcome] = self.redis_calls.get(outcome, 0) + 1
        if outcome != "circuit_open":  # failed fast: no call was made
            self.redis_duration.observe(seconds)

    def conn_taken(self, zones: Iterable[str], step: int) -> None:
        active = self.conn_active
        for zone in zones:
            active[zone] = active.get(zone, 0) + step

    # -- scrape time ------------------------------------------------------------------------------
    def gauge(self, family: str, source: GaugeSource) -> None:
        """Read ``family`` from ``source`` at every scrape (a later call replaces the source).

        A family whose name ends in ``_total`` is a counter the source keeps itself."""
        self.gauges[family] = source

    def snapshot(self) -> dict[str, Any]:
        counters: dict[str, list[list[Any]]] = {
            "gateway_requests_total": [
                [route, str(status), n] for route, slot in self.routes.items() for status, n in slot.statuses.items()
            ],
            "gateway_limit_decisions_total": [
                [zone, kind, OUTCOMES[i], n]
                # list(): a reload compiling in a thread may add slots meanwhile (list() holds the GIL)
                for (zone, kind), counts in list(self.decisions.items())
                for i, n in enumerate(counts)
                if n
            ],
            "gateway_redis_calls_total": [[outcome, n] for outcome, n in self.redis_calls.items()],
        }
        histograms: dict[str, list[list[Any]]] = {
            "gateway_request_duration_seconds": [
                [route, list(slot.duration.counts), slot.duration.sum] for route, slot in self.routes.items()
            ],
            "gateway_upstream_duration_seconds": [[name, list(h.counts), h.sum] for name, h in self.upstreams.items()],
            "gateway_limit_delay_seconds": [[zone, list(h.counts), h.sum] for zone, h in self.delays.items()],
            "gateway_redis_call_duration_seconds": (
                [[list(self.redis_duration.counts), self.redis_duration.sum]] if self.redis_calls else []
            ),
        }
        gauges: dict[str, list[list[Any]]] = {
            "gateway_limit_conn_active": [[zone, n] for zone, n in self.conn_active.items()],
        }
        for family, source in self.gauges.items():
            try:
                (counters if family.endswith("_total") else gauges)[family] = [list(row) for row in source()]
            except Exception:  # a scrape must never fail on one source
                continue
        return {"c": counters, "h": histograms, "g": gauges}


def merge(snapshots: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The node's snapshot: counters and histograms added, gauges by ``GAUGE_MERGE``."""
    counters: dict[str, dict[tuple[Any, ...], float]] = {}
    histograms: dict[str, dict[tuple[Any, ...], tuple[list[int], float]]] = {}
    gauges: dict[str, dict[tuple[Any, ...], list[float]]] = {}
    for snap in snapshots:
        for family, rows in snap.get("c", {}).items():
            into = counters.setdefault(family, {})
            for row in rows:
                key = tuple(row[:-1])
                into[key] = into.get(key, 0) + row[-1]
        for family, rows in snap.get("h", {}).items():
            into_h = histograms.setdefault(family, {})
            for row in rows:
                key = tuple(row[:-2])
                counts, total = row[-2], row[-1]
                have = into_h.get(key)
                if have is None:
                    into_h[key] = (list(counts), total)
                else:
                    into_h[key] = ([a + b for a, b in zip(have[0], counts, strict=True)], have[1] + total)
        for family, rows in snap.get("g", {}).items():
            into_g = gauges.setdefault(family, {})
            for row in rows:
                into_g.setdefault(tuple(row[:-1]), []).append(row[-1])
    return {
        "c": {family: [[*key, value] for key, value in rows.items()] for family, rows in counters.items()},
        "h": {family: [[*key, c, s] for key, (c, s) in rows.items()] for family, rows in histograms.items()},
        "g": {
            family: [[*key, GAUGE_MERGE.get(family, sum)(values)] for key, values in rows.items()]
            for family, rows in gauges.items()
        },
    }


def retire(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What a worker that is gone leaves behind: its counters and histograms, not its gauges."""
    return {"c": snapshot.get("c", {}), "h": snapshot.get("h", {}), "g": {}}


STATS = Stats()  # this process's metrics (one serving loop per process)
