"""The master <-> worker stats channel on a real Unix socket: merging, stuck and retired workers."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gateway.metrics import channel
from gateway.metrics.stats import Stats, merge, retire


def test_merge_adds_counters_and_histograms_and_merges_gauges_by_kind():
    a, b = Stats(), Stats()
    a.request("/x", 200, 0.003)
    b.request("/x", 200, 0.2)
    b.request("/x", 503, 0.2)
    a.gauge("gateway_upstream_server_up", lambda: [("app", "10.0.0.1:80", 1)])
    b.gauge("gateway_upstream_server_up", lambda: [("app", "10.0.0.1:80", 0)])
    a.gauge("gateway_bans_active", lambda: [(3,)])
    b.gauge("gateway_bans_active", lambda: [(3,)])
    a.gauge("gateway_connections", lambda: [("active", 2)])
    b.gauge("gateway_connections", lambda: [("active", 5)])
    node = merge([a.snapshot(), b.snapshot()])
    assert sorted(node["c"]["gateway_requests_total"]) == [["/x", "200", 2], ["/x", "503", 1]]
    [(route, counts, total)] = node["h"]["gateway_request_duration_seconds"]
    assert route == "/x" and sum(counts) == 3 and counts[0] == 1 and abs(total - 0.403) < 1e-9
    assert node["g"]["gateway_upstream_server_up"] == [["app", "10.0.0.1:80", 0]]  # down in any worker
    assert node["g"]["gateway_bans_active"] == [[3]]  # each worker holds the whole list
    assert node["g"]["gateway_connections"] == [["active", 7]]
    assert retire(node)["g"] == {} and retire(node)["c"] == node["c"]


@pytest.mark.timing
async def test_a_stuck_worker_does_not_hang_a_scrape_and_a_retired_one_keeps_its_counts(tmp_path):
    name = "test-counter"
    counts = {"n": 0}
    channel.register(name, lambda: {"n": counts["n"]}, lambda items: {"n": sum(i["n"] for i in items)})
    try:
        server = channel.StatsServer(str(tmp_path / "stats.sock"))
        await server.start()
        worker = channel.StatsClient(server.path)
        await worker.start()
        # a second "worker" that says hello and then never answers
        _, stuck = await asyncio.open_unix_connection(server.path)
        body = json.dumps({"pid": 1}).encode()
        stuck.write(len(body).to_bytes(4, "big") + body)
        await stuck.drain()
        deadline = time.monotonic() + 5
        while len(server.live) < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

        counts["n"] = 5
        started = time.monotonic()
        node = await server.collect()
        assert node[name] == {"n": 5}
        assert server.answered == 1
        assert time.monotonic() - started < channel.ASK_TIMEOUT_S + 0.5

        counts["n"] = 7  # counted after the last scrape: the final snapshot carries it
        await worker.close()
        deadline = time.monotonic() + 5
        while len(server.live) > 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        counts["n"] = 0  # this process's provider now reports nothing: only the retired total is left
        node = await server.collect()
        assert node[name] == {"n": 7}
        stuck.close()
        await server.close()
    finally:
        del channel.PROVIDERS[name]
