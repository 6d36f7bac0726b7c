"""Prometheus text from a (merged) stats snapshot, through a prometheus_client Collector.

The request path only adds to plain ints (``gateway/metrics/stats.py``); this runs at scrape
time: the families are built from the snapshot (``prometheus_client.core.*MetricFamily``) and
``generate_latest`` writes them in the text format.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gateway.metrics.activity import ConfigInfo
from gateway.metrics.stats import BUCKETS

# family -> (help, label names); names of counters without their _total suffix are added below.
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gateway_requests_total": ("Requests answered, by route (location) and status", ("route", "status")),
    "gateway_limit_decisions_total": (
        "Limit decisions by zone, kind (limit_req, limit_count, limit_conn, limit_gcra, ..., ban) and outcome",
        ("zone", "kind", "outcome"),
    ),
    "gateway_redis_calls_total": ("Redis calls of the request path, by outcome", ("outcome",)),
    "gateway_request_duration_seconds": ("Time from the request to the end of the response", ("route",)),
    "gateway_upstream_duration_seconds": (
        "Time spent with the upstream ($upstream_response_time; for a WebSocket, its handshake up to the 101)",
        ("upstream",),
    ),
    "gateway_limit_delay_seconds": ("Delays imposed by limit_req (and token) zones", ("zone",)),
    "gateway_redis_call_duration_seconds": ("Duration of Redis calls of the request path", ()),
    "gateway_connections": ("Client connections: active = busy + idle (keep-alive or reading a header)", ("state",)),
    "gateway_connections_refused_total": ("Client connections refused at accept (caps)", ()),
    "gateway_limit_conn_active": ("limit_conn slots held by requests in flight", ("zone",)),
    "gateway_bans_active": ("Manual bans in force (the ban list; a zone's own bans are not in it)", ()),
    "gateway_redis_circuit_open": ("1 while the Redis circuit breaker is open", ()),
    "gateway_bans_restored_total": (
        "Bans this node put back in Redis after Redis lost the shared ban list (a restart without its data)",
        (),
    ),
    "gateway_upstream_server_up": ("Passive health: 0 while max_fails took the server out", ("upstream", "server")),
    "gateway_upstream_server_connections": (
        "Requests (and WebSocket tunnels) holding the server now: what least_conn compares, per worker",
        ("upstream", "server"),
    ),
    "python_gc_collections_total": ("Runs of Python's cyclic garbage collector, by generation", ("generation",)),
    "python_gc_objects_collected_total": ("Objects the cyclic collector freed, by generation", ("generation",)),
    "python_gc_objects_uncollectable_total": ("Objects the cyclic collector found but could not free", ("generation",)),
}


def config_families(config: ConfigInfo) -> list[Metric]:
    info = GaugeMetricFamily("gateway_config_info", "The config in force: sha256 of its file", labels=["hash"])
    info.add_metric([config.hash], 1)
    reloads = CounterMetricFamily("gateway_config_reloads", "Configuration reloads by result", labels=["result"])
    for result, n in config.results.items():
        reloads.add_metric([result], n)
    loaded = GaugeMetricFamily(
        "gateway_config_last_reload_timestamp_seconds", "When the configuration in force was loaded (Unix time)"
    )
    loaded.add_metric([], config.in_force_ms / 1000)
    return [info, reloads, loaded]


def families(snapshot: dict[str, Any]) -> list[Metric]:
    out: list[Metric] = []
    counters = snapshot.get("c", {})
    histograms = snapshot.get("h", {})
    gauges = snapshot.get("g", {})
    for name, (doc, labels) in FAMILIES.items():
        if name in BUCKETS:
            bounds = BUCKETS[name]
            hist = HistogramMetricFamily(name, doc, labels=list(labels))
            for row in histograms.get(name, ()):
                counts, total = row[-2], row[-1]
                cumulative: list[tuple[str, float]] = []
                running = 0
                for bound, n in zip((*map(repr, bounds), "+Inf"), counts, strict=True):
                    running += n
                    cumulative.append((bound, running))
                hist.add_metric([str(v) for v in row[:-2]], cumulative, total)
            out.append(hist)
        elif name.endswith("_total"):
            counter = CounterMetricFamily(name[: -len("_total")], doc, labels=list(labels))
            for row in counters.get(name, ()):
                counter.add_metric([str(v) for v in row[:-1]], row[-1])
            out.append(counter)
        else:
            gauge = GaugeMetricFamily(name, doc, labels=list(labels))
            for row in gauges.get(name, ()):
                gauge.add_metric([str(v) for v in row[:-1]], row[-1])
            out.append(gauge)
    return out


class _Families(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics


def render(snapshot: dict[str, Any], config: ConfigInfo | None, workers: int = 1) -> bytes:
    metrics = families(snapshot)
    if config is not None:
        metrics.extend(config_families(config))
    reporting = GaugeMetricFamily("gateway_workers_reporting", "Worker processes counted in this scrape")
    reporting.add_metric([], workers)
    metrics.append(reporting)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(metrics))
    return generate_latest(registry)
