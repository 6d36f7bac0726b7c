"""Limits end to end: the CLI-started gateway, a real upstream, real clocks."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
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


@pytest.mark.timing
async def test_delayed_requests_really_wait_and_overflow_is_rejected(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  one: {type: req, key: $binary_remote_addr, rate: 2r/s}",
            "    limit_req: [{zone: one, burst: 3}]",
        )
    )
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(*(get(gw.url + "/echo", session=session) for _ in range(5)))
    statuses = sorted(r[0] for r in results)
    assert statuses == [200, 200, 200, 200, 503]
    waits = sorted(r[3] for r in results if r[0] == 200)
    for measured, expected in zip(waits, (0.0, 0.5, 1.0, 1.5), strict=True):
        assert expected - 0.05 <= measured <= expected + 0.3, waits
    rejected = next(r for r in results if r[0] == 503)
    assert rejected[3] < 0.3
    statuses_logged = sorted(entry["limit_req_status"] for entry in gw.access_json())
    assert statuses_logged == ["DELAYED", "DELAYED", "DELAYED", "PASSED", "REJECTED"]
    errors = gw.stderr()
    rejected_line = re.search(
        r'\[error\] \d+#0: limiting requests, excess: (\d\.\d{3}) by zone "one", client: 127\.0\.0\.1, '
        r'server: , request: "GET /echo HTTP/1\.1", host: "127\.0\.0\.1:\d+"',
        errors,
    )
    assert rejected_line and 3.0 < float(rejected_line.group(1)) <= 4.0  # over burst=3
    delays = re.findall(r'\[warn\] \d+#0: delaying request, excess: (\d\.\d{3}), by zone "one"', errors)
    assert len(delays) == 3


@pytest.mark.timing
async def test_disconnect_while_delayed_frees_everything(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  one: {type: req, key: $binary_remote_addr, rate: 1r/s}\n  conns: {type: conn, key: $binary_remote_addr}",
            "    limit_req: [{zone: one, burst: 5}]\n    limit_conn: [{zone: conns, max: 1}]",
        )
    )
    async with aiohttp.ClientSession() as session:
        assert (await get(gw.url + "/echo", session=session))[0] == 200
        delayed = asyncio.ensure_future(get(gw.url + "/echo?delayed", session=session))
        await asyncio.sleep(0.3)
        delayed.cancel()  # the client goes away while the gateway holds the request
        with pytest.raises(asyncio.CancelledError):
            await delayed
        await asyncio.sleep(1.2)  # past the moment the delay would have ended
    assert all("delayed" not in entry["path"] for entry in upstream.seen)  # never proxied
    log = gw.access_json()
    gone = [e for e in log if "delayed" in e["request_uri"]]
    assert len(gone) == 1 and gone[0]["status"] == 499 and gone[0]["limit_req_status"] == "DELAYED"
    # no limit_conn slot was taken or leaked: a long request still gets the only slot
    async with aiohttp.ClientSession() as session:
        status, _, _, _ = await get(gw.url + "/slow?ms=10", session=session)
    assert status == 200


async def test_limit_conn_slot_is_held_until_the_response_ends(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  conns: {type: conn, key: $binary_remote_addr}",
            "    limit_conn: [{zone: conns, max: 1}]\n    limit_conn_status: 429",
        )
    )
    async with aiohttp.ClientSession() as session:
        holder = asyncio.ensure_future(get(gw.url + "/slow?ms=800", session=session))
        await asyncio.sleep(0.3)
        status, headers, _, _ = await get(gw.url + "/echo", session=session)
        assert status == 429
        assert headers["Retry-After"] == "1"
        assert (await holder)[0] == 200
        assert (await get(gw.url + "/echo", session=session))[0] == 200
        # a client that aborts releases its slot
        aborted = asyncio.ensure_future(get(gw.url + "/slow?ms=2000", session=session))
        await asyncio.sleep(0.3)
        aborted.cancel()
        await asyncio.gather(aborted, return_exceptions=True)
        await asyncio.sleep(0.2)
        assert (await get(gw.url + "/echo", session=session))[0] == 200
    log = gw.access_json()
    assert [e["limit_conn_status"] for e in log if e["status"] == 429] == ["REJECTED"]
    assert re.search(r'limiting connections by zone "conns"', gw.stderr())


async def test_limit_conn_slot_is_released_after_an_upstream_error(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  conns: {type: conn, key: $binary_remote_addr}",
            "    limit_conn: [{zone: conns, max: 1}]",
        )
    )
    upstream.stop()  # every request now fails with 502
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # 502, never 503: each failed request gave its slot back
            assert (await get(gw.url + "/echo", session=session))[0] == 502


@pytest.mark.timing
async def test_ratelimit_headers_on_success_and_rejection(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  one: {type: req, key: $binary_remote_addr, rate: 10r/s}\n"
            "  quota: {type: count, key: $http_x_api_key, limit: 2, window: 60s}",
            "    limit_req: [{zone: one, burst: 5, nodelay: true}]\n"
            "    limit_count: [{zone: quota}]\n    limit_count_status: 429",
        )
    )
    async with aiohttp.ClientSession() as session:
        status, headers, _, _ = await get(gw.url + "/echo", session=session, headers={"X-Api-Key": "k1"})
        assert status == 200
        assert headers["RateLimit-Policy"] == '"one";q=10;w=1, "quota";q=2;w=60'
        assert headers["RateLimit"] == '"one";r=5;t=0, "quota";r=1;t=60'
        status, headers, _, _ = await get(gw.url + "/echo", session=session, headers={"X-Api-Key": "k1"})
        assert headers["RateLimit"].endswith('"quota";r=0;t=60')
        status, headers, body, _ = await get(
            gw.url + "/echo", session=session, headers={"X-Api-Key": "k1", "Accept": "application/json"}
        )
        assert status == 429
        assert headers["Retry-After"] in ("59", "60")
        assert headers["Content-Type"].startswith("application/json")
        assert json.loads(body) == {
            "status": 429,
            "error": "rate limit exceeded",
            "retry_after": int(headers["Retry-After"]),
        }
        # no API key: the count limit does not apply, and its item is absent
        status, headers, _, _ = await get(gw.url + "/echo", session=session)
        assert status == 200 and '"quota"' not in headers["RateLimit"]
    log = gw.access_json()
    assert [e["limit_count_status"] for e in log] == ["PASSED", "PASSED", "REJECTED", ""]


async def test_ratelimit_headers_can_be_switched_off(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  one: {type: req, key: $binary_remote_addr, rate: 1r/s}",
            "    limit_req: [{zone: one}]\n    ratelimit_headers: false",
        )
    )
    async with aiohttp.ClientSession() as session:
        _, ok_headers, _, _ = await get(gw.url + "/echo", session=session)
        status, headers, _, _ = await get(gw.url + "/echo", session=session)
    assert status == 503
    assert "RateLimit" not in ok_headers and "RateLimit-Policy" not in headers
    assert headers["Retry-After"] == "1"


async def test_dry_run_never_refuses_but_logs(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  one: {type: req, key: $binary_remote_addr, rate: 1r/m}",
            "    limit_req: [{zone: one, burst: 1}]\n    dry_run: true",
        )
    )
    async with aiohttp.ClientSession() as session:
        results = [await get(gw.url + "/echo", session=session) for _ in range(3)]
    assert [r[0] for r in results] == [200, 200, 200]
    assert all(r[3] < 0.5 for r in results)  # the computed 62.5 s delay is not applied
    assert [e["limit_req_status"] for e in gw.access_json()] == ["PASSED", "DELAYED_DRY_RUN", "REJECTED_DRY_RUN"]
    assert "delaying request, dry run, excess: 1.000, by zone" in gw.stderr()
    assert "limiting requests, dry run, excess: 2.000 by zone" in gw.stderr()


async def test_access_lists(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  one: {type: req, key: $binary_remote_addr, rate: 1r/m}",
            "    limit_req: [{zone: one}]",
            "access:\n  allow: [127.0.0.1]\n  deny: [127.0.0.2]\n",
        )
    )
    async with aiohttp.ClientSession() as session:
        assert [(await get(gw.url + "/echo", session=session))[0] for _ in range(3)] == [
            200,
            200,
            200,
        ]  # allowed: never limited
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        assert (await get(gw.url + "/echo", session=session))[0] == 403
    assert "access forbidden by rule" in gw.stderr()


async def test_reload_keeps_zone_state_and_a_bad_reload_keeps_the_old_config(gateway_factory, upstream):
    make = limited_config(
        upstream,
        "  one: {type: req, key: $binary_remote_addr, rate: 1r/m}",
        "    limit_req: [{zone: one}]",
    )
    gw = gateway_factory(make)
    async with aiohttp.ClientSession() as session:
        assert (await get(gw.url + "/echo", session=session))[0] == 200
        assert (await get(gw.url + "/echo", session=session))[0] == 503
        # same zone and key, another status: the state survives, the new status applies
        gw.write_config(
            make(gw.port).replace(
                "    limit_req: [{zone: one}]", "    limit_req: [{zone: one}]\n    limit_req_status: 429"
            )
        )
        gw.reload()
        assert (await get(gw.url + "/echo", session=session))[0] == 429
        # a broken file: errors logged with their line, the running config stays
        gw.write_config(make(gw.port).replace("rate: 1r/m", "rate: 1.5r/m"))
        gw.reload()
        assert (await get(gw.url + "/echo", session=session))[0] == 429
    assert re.search(
        r"reload failed, keeping the running configuration: .*limits\.yaml:\d+:\d+: zones\.one\.rate: invalid rate",
        gw.stderr(),
    )


async def test_limits_count_the_whole_node_across_workers(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  quota: {type: count, key: $binary_remote_addr, limit: 10, window: 60s}\n"
            "  conns: {type: conn, key: $binary_remote_addr}",
            "    limit_count: [{zone: quota}]\n    limit_conn: [{zone: conns, max: 1}]",
            "workers: 3\n",
        )
    )
    await gw.wait_workers(3)
    statuses = []
    for _ in range(30):  # a fresh connection each: the kernel spreads them over the workers
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            statuses.append((await get(gw.url + "/echo", session=session))[0])
    assert statuses.count(200) == 10 and statuses.count(429) == 20
    # the requests really came through several workers (their pids differ in the error log)
    pids = set(re.findall(r"\] (\d+)#0: limiting requests, count", gw.stderr()))
    assert len(pids) >= 2, pids


async def test_limit_conn_across_workers_and_a_dead_worker_frees_its_slots(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  conns: {type: conn, key: $binary_remote_addr}",
            "    limit_conn: [{zone: conns, max: 1}]",
            "workers: 2\n",
        )
    )
    await gw.wait_workers(2)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as holder_session:
        holder = asyncio.ensure_future(get(gw.url + "/slow?ms=3000", session=holder_session))
        await asyncio.sleep(0.5)
        for _ in range(6):  # whichever worker takes the connection, the node's one slot is taken
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                assert (await get(gw.url + "/echo", session=session))[0] == 503
        # kill the workers (one of them holds the slot): the master gives their slots back
        for pid in gw.worker_pids():
            os.kill(pid, signal.SIGKILL)
        await asyncio.gather(holder, return_exceptions=True)
    deadline = time.monotonic() + 10
    while len(gw.worker_pids()) < 4 and time.monotonic() < deadline:  # two respawned workers
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)
    ok = 0
    for _ in range(4):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            ok += (await get(gw.url + "/echo", session=session))[0] == 200
    assert ok == 4
    assert "exited on signal 9" in gw.stderr()


async def test_keys_from_non_latin_1_headers_work_and_stay_distinct(gateway_factory, upstream):
    gw = gateway_factory(
        limited_config(
            upstream,
            "  by_cookie: {type: req, key: $cookie_user, rate: 1r/m}",
            "    limit_req: [{zone: by_cookie}]",
        )
    )
    async with aiohttp.ClientSession() as session:
        assert (await get(gw.url + "/echo", session=session, headers={"Cookie": "user=日本"}))[0] == 200
        assert (await get(gw.url + "/echo", session=session, headers={"Cookie": "user=中国"}))[0] == 200  # another key
        assert (await get(gw.url + "/echo", session=session, headers={"Cookie": "user=日本"}))[0] == 503


@pytest.mark.timing
async def test_a_request_waiting_out_a_delay_survives_a_reload_that_renames_its_upstream(gateway_factory, upstream):
    make = limited_config(
        upstream,
        "  one: {type: req, key: $binary_remote_addr, rate: 1r/s}",
        "    limit_req: [{zone: one, burst: 5}]",
    )
    gw = gateway_factory(make)
    async with aiohttp.ClientSession() as session:
        assert (await get(gw.url + "/echo", session=session))[0] == 200
        delayed = asyncio.ensure_future(get(gw.url + "/echo?waiting", session=session))
        await asyncio.sleep(0.3)
        gw.write_config(make(gw.port).replace("  app: {", "  renamed: {").replace("upstream: app", "upstream: renamed"))
        gw.reload(settle=0.2)
        status, _, _, waited = await delayed
    assert status == 200 and waited > 0.8
    assert "Traceback" not in gw.stderr()
