"""The zones of the newer algorithms (gcra) end to end: CLI-started gateway, real upstream."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable

import aiohttp
import pytest

from tests.support.config import config
from tests.support.http import get
from tests.support.upstreams import Upstream

TOP = "shutdown_timeout: 5s\nlog: {format: json}"


def limited_config(upstream: Upstream, zones: str, route: str, extra: str = "") -> Callable[[int], str]:
    """The one route ``/`` with the limits under test, JSON access log, a 5 s upstream timeout."""
    return config(upstream, top=TOP, zones=zones, upstream_options="read_timeout: 5s", route=route, extra=extra)


async def test_gcra_headers_retry_after_status_variable_and_error_log(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  cell: {type: gcra, key: $binary_remote_addr, burst: 1, rate: 30r/m}",
            "    limits: [{zone: cell}]",
        )
    )
    async with aiohttp.ClientSession() as session:
        seen = [await get(gw.url + "/echo", session=session, headers={"Accept": "application/json"}) for _ in range(3)]
    (s1, h1, _, _), (s2, h2, _, _), (s3, h3, body, _) = seen
    assert (s1, s2, s3) == (200, 200, 429)
    # T = 2 s, tau = 4 s: CL.THROTTLE's remaining and reset_after
    assert h1["RateLimit-Policy"] == '"cell";q=2;w=4'
    assert h1["RateLimit"] == '"cell";r=1;t=2'
    assert h2["RateLimit"] == '"cell";r=0;t=4'
    assert h3["Retry-After"] == "2" and h3["RateLimit"] == '"cell";r=0;t=4'
    assert json.loads(body) == {"status": 429, "error": "rate limit exceeded", "retry_after": 2}
    assert [e["limit_gcra_status"] for e in gw.access_json()] == ["PASSED", "PASSED", "REJECTED"]
    assert 'limiting requests, gcra: remaining 0 of 2, retry after 2s by zone "cell"' in gw.stderr()


async def test_gcra_cost_from_a_header_and_a_bad_cost_is_a_400(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  cell: {type: gcra, key: $binary_remote_addr, burst: 9, rate: 1r/m, cost: $http_x_cost}",
            "    limits: [{zone: cell}]",
        )
    )
    async with aiohttp.ClientSession() as session:
        status, headers, _, _ = await get(gw.url + "/echo", session=session, headers={"X-Cost": "7"})
        assert status == 200 and headers["RateLimit"] == '"cell";r=3;t=420'
        for bad in ("-1", "2.5", "ab", "99999999999", "\uff11"):
            status, _, body, _ = await get(gw.url + "/echo", session=session, headers={"X-Cost": bad})
            assert status == 400 and bad not in body.decode()
        status, headers, _, _ = await get(gw.url + "/echo", session=session, headers={"X-Cost": "4"})
        assert status == 429  # 7 + 4 > 10: rejected, and nothing charged
        status, headers, _, _ = await get(gw.url + "/echo", session=session)  # no header: cost 1
        assert status == 200 and headers["RateLimit"] == '"cell";r=2;t=480'


async def test_gcra_counts_the_whole_node_across_workers(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  cell: {type: gcra, key: $binary_remote_addr, burst: 4, rate: 1r/h}",
            "    limits: [{zone: cell}]",
            "workers: 2\n",
        )
    )
    await gw.wait_workers(2)
    statuses = []
    for _ in range(12):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            statuses.append((await get(gw.url + "/echo", session=session))[0])
    assert statuses == [200] * 5 + [429] * 7


async def test_sliding_count_zone_through_limit_count(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  quota: {type: count, key: $binary_remote_addr, limit: 3, window: 1h, window_type: sliding}",
            "    limit_count: [{zone: quota}]",
        )
    )
    async with aiohttp.ClientSession() as session:
        seen = [await get(gw.url + "/echo", session=session) for _ in range(4)]
    assert [status for status, _, _, _ in seen] == [200, 200, 200, 429]
    remaining = [h["RateLimit"].split(";")[1] for _, h, _, _ in seen]
    assert remaining[:3] == ["r=2", "r=1", "r=0"]  # no earlier window: remaining = limit - current
    assert 0 < int(seen[3][1]["Retry-After"]) <= 3600
    assert [e["limit_count_status"] for e in gw.access_json()] == ["PASSED"] * 3 + ["REJECTED"]


async def test_sliding_log_headers_retry_after_and_status_variable(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  log: {type: sliding_log, key: $binary_remote_addr, limit: 2, window: 30s}",
            "    limits: [{zone: log}]",
        )
    )
    async with aiohttp.ClientSession() as session:
        seen = [await get(gw.url + "/echo", session=session) for _ in range(3)]
    assert [status for status, _, _, _ in seen] == [200, 200, 429]
    assert seen[0][1]["RateLimit-Policy"] == '"log";q=2;w=30'
    assert [h["RateLimit"] for _, h, _, _ in seen[:2]] == ['"log";r=1;t=30', '"log";r=0;t=30']
    assert seen[2][1]["Retry-After"] in ("29", "30")
    assert [e["limit_sliding_log_status"] for e in gw.access_json()] == ["PASSED", "PASSED", "REJECTED"]
    assert "limiting requests, sliding_log: remaining 0 of 2" in gw.stderr()


@pytest.mark.timing
async def test_token_bucket_makes_the_request_wait_then_rejects_past_max_delay(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  bucket: {type: token, key: $binary_remote_addr, rate: 5r/s, max_delay: 300ms}",
            "    limits: [{zone: bucket}]",
        )
    )
    async with aiohttp.ClientSession() as session:
        quick = [await get(gw.url + "/echo", session=session) for _ in range(6)]  # 5 stored, the 6th pays ahead
        status, _, _, elapsed = await get(gw.url + "/echo", session=session)
        # It waited for its permit, as long as the gateway decided (~0.2 s when the six quick
        # ones came at once; less on a busy machine, where they came slower and the bucket refilled).
        delays = re.findall(r"delaying request, token: (\d+) ms", gw.stderr())
        assert status == 200 and delays and elapsed >= int(delays[0]) / 1000 - 0.01, (elapsed, delays)
        burst = await asyncio.gather(*(get(gw.url + "/echo", session=session) for _ in range(4)))
    assert [q[0] for q in quick] == [200] * 6
    assert quick[0][1]["RateLimit-Policy"] == '"bucket";q=5;w=1'
    # one more fits within max_delay (waits ~0.2 s); the others would wait 0.4 s+: rejected
    assert sorted(r[0] for r in burst) == [200, 429, 429, 429]
    assert all(r[1]["Retry-After"] == "1" for r in burst if r[0] == 429)
    log = [e["limit_token_status"] for e in gw.access_json()]
    assert log[:6] == ["PASSED"] * 6 and log[6] == "DELAYED"
    assert sorted(log[7:]) == ["DELAYED", "REJECTED", "REJECTED", "REJECTED"]
    assert "delaying request, token:" in gw.stderr()
